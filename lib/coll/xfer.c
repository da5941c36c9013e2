/* The transport verbs: a link's post / acquire / release / flush, each counting bytes, messages
 * and waiting on the call's communicator (per purpose, and across nodes), and every received
 * message checked against the call's fingerprint. */
#include "config.h"
#include <stdint.h>
#include "distlab.h"
#include "transport/chan.h"
#include "runtime/internal.h"
#include "coll/prims.h"

int dl__xfer_post(dl_call *k, dl_link *l, const void *data, size_t bytes)
{
    dl_msg m = {data, bytes, k->check};
    dl_comm_stats *st = &k->c->st;
    uint64_t w0 = l->stats.send_wait_ns, c0 = l->stats.copy_ns, s0 = l->stats.send_sleeps;
    int rc = dl_link_post(l, &m, k->w);
    st->wait_ns += l->stats.send_wait_ns - w0;
    st->copy_ns += l->stats.copy_ns - c0;
    st->sleeps += l->stats.send_sleeps - s0;
    if (rc)
        return rc;
    st->bytes_sent[k->p] += bytes;
    st->msgs_sent++;
    if (l->inter)
        st->bytes_sent_inter += bytes;
    return DL_OK;
}

int dl__xfer_acquire(dl_call *k, dl_link *l, size_t bytes, const void **data)
{
    dl_msg m;
    dl_comm_stats *st = &k->c->st;
    uint64_t w0 = l->stats.recv_wait_ns, s0 = l->stats.recv_sleeps;
    int rc = dl_link_acquire(l, &m, k->w);
    st->wait_ns += l->stats.recv_wait_ns - w0;
    st->sleeps += l->stats.recv_sleeps - s0;
    if (rc)
        return rc;
    if (m.check != k->check || m.bytes != bytes) {
        dl_link_release(l);
        return dl_error(DL_EMISMATCH,
                        "message from rank %d does not match this call (%zu bytes, expected "
                        "%zu%s): "
                        "ranks disagree on the operation, count, type, op or root",
                        l->src, m.bytes, bytes, m.check != k->check ? ", different call" : "");
    }
    st->bytes_recv[k->p] += bytes;
    st->msgs_recv++;
    if (l->inter)
        st->bytes_recv_inter += bytes;
    *data = m.data;
    return DL_OK;
}

int dl__xfer_release(dl_call *k, dl_link *l)
{
    (void)k;
    return dl_link_release(l);
}

int dl__xfer_flush(dl_call *k, dl_link *l)
{
    uint64_t w0 = l->stats.send_wait_ns, s0 = l->stats.send_sleeps;
    int rc = dl_link_flush(l, k->w);
    k->c->st.wait_ns += l->stats.send_wait_ns - w0;
    k->c->st.sleeps += l->stats.send_sleeps - s0;
    return rc;
}
