/* Machine: the simulated GPU's memory, the watchdog, the synthetic topology and the rank
 * threads per process. */
#include <stdint.h>
#include "group.h"
#include "cli.h"
#include "core/blas.h"
#include "core/fault_spec.h"
#include "core/topo.h"

static int p_mem(tg_run *r, const char *a)
{
    uint64_t u;
    int bad = cli_parse_size("--gpu-mem", a, 1, UINT64_MAX, &u);
    if (!bad)
        r->o.machine.gpu_mem = u;
    return bad;
}
static int p_timeout(tg_run *r, const char *a)
{
    double d;
    int bad = cli_parse_double("--timeout", a, 0, 1e9, &d);
    if (!bad)
        r->o.machine.timeout_s = d;
    return bad;
}
static int p_topo(tg_run *r, const char *a)
{
    r->o.machine.topology = a;
    return 0;
}
/* --inject-fault: checked here so that a bad spec is a usage error (exit 2) */
static int p_fault(tg_run *r, const char *a)
{
    dl__fault f;
    if (dl__fault_parse(a, &f)) {
        cli_error("%s", dl_errmsg());
        return -1;
    }
    r->o.machine.inject_fault = a;
    return 0;
}
static int p_threads(tg_run *r, const char *a)
{
    return cli_parse_int("--threads", a, 1, 4096, &r->threads);
}

/* a bad or oversized synthetic topology (--topology or DISTLAB_TOPOLOGY) is a usage error */
static int check_topology(tg_run *r)
{
    dl_topo *t;
    if (dl_topo_load(&t, r->o.machine.topology))
        return tg_refuse(r, "--topology: %s", dl_errmsg());
    dl_topo_destroy(t);
    return TG_NEXT;
}

static void j_kernel(FILE *f, const tg_run *r)
{
    (void)r;
    fprintf(f, "\"%s\"", dl_blas_loaded_kernel());
}

/* clang-format off */
static const tg_opt opts[] = {
    {"gpu-mem", 1, p_mem,
"  --gpu-mem SIZE        memory per rank (\"GPU memory\"), e.g. 512M; exceeding it is an error\n"},
    {"timeout", 1, p_timeout,
"  --timeout SEC         watchdog: a rank stuck this long is an error (default 120)\n"},
    {"topology", 1, p_topo,
"  --topology STR        synthetic topology for grouping ranks into nodes\n"},
    {"inject-fault", 1, p_fault,
"  --inject-fault rank=R,at=step:N|coll:COMM:N,kind=error|hang|slow:MS|crash\n"
"                        a fault in world rank R at its N-th step, or before its N-th\n"
"                        collective on COMM (dp, tp, pp or world; counted per communicator):\n"
"                        error fails it (exit 1), hang stops there (the watchdog, --timeout,\n"
"                        names the rank, the operation and its sequence; exit 1), slow:MS\n"
"                        sleeps MS ms before it, crash kills the process (exit 3); the last\n"
"                        complete checkpoint resumes (docs/CHECKPOINTS.md)\n"},
    {"threads", 1, p_threads,
"  --threads N           rank threads per process: under mpirun -np P the world is P x N\n"
"                        ranks (= dp x tp x pp; default: dp x tp x pp / P), process k hosting\n"
"                        ranks kN ... kN+N-1; without mpirun N is the world (README: Running on\n"
"                        several machines)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, check_topology}, {0}};
static const tg_field config[] = {{"blas_kernel", j_kernel, NULL}, {0}};

const tg_group tg_machine = {.heading = "Machine:\n",
                             .opts = opts,
                             .hooks = hooks,
                             .config = config};
