/* Layout: the dp x tp x pp mesh, the world it needs (ranks per process under mpirun) and the
 * library's resolution of the whole configuration. */
#include <unistd.h>
#include "group.h"
#include "cli.h"

static int p_dp(tg_run *r, const char *a)
{
    return cli_parse_int("--dp", a, 1, 4096, &r->o.layout.dp);
}
static int p_tp(tg_run *r, const char *a)
{
    return cli_parse_int("--tp", a, 1, 4096, &r->o.layout.tp);
}
static int p_pp(tg_run *r, const char *a)
{
    return cli_parse_int("--pp", a, 1, 4096, &r->o.layout.pp);
}

static void init(tg_run *r)
{
    r->o.layout.dp = 0; /* not given: from --threads, else the cores */
    r->o.layout.pp = 1;
}

/* dp when not given, and a world that fits the processes */
static int world(tg_run *r)
{
    dl_train_opts *o = &r->o;
    long tp_pp = (long)o->layout.tp * o->layout.pp, np = r->nprocs;
    if (o->layout.dp == 0 && r->threads > 0 && np * r->threads % tp_pp == 0)
        o->layout.dp = (int)(np * r->threads / tp_pp);
    if (o->layout.dp == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o->layout.dp = cores / tp_pp > 0 ? (int)(cores / tp_pp) : 1;
    }
    long n = o->layout.dp * tp_pp;
    if (r->threads > 0 && n != np * r->threads)
        return tg_refuse(r,
                         "--threads %d: dp %d x tp %d x pp %d = %ld ranks is not %d process%s x "
                         "%d threads",
                         r->threads, o->layout.dp, o->layout.tp, o->layout.pp, n, r->nprocs,
                         r->nprocs > 1 ? "es" : "", r->threads);
    if (np > 1 && n % np)
        return tg_refuse(r, "dp %d x tp %d x pp %d = %ld ranks do not divide over %d processes",
                         o->layout.dp, o->layout.tp, o->layout.pp, n, r->nprocs);
    return TG_NEXT;
}

static int resolve(tg_run *r)
{
    if (dl_train_resolve(&r->o, r->o.layout.dp * r->o.layout.tp * r->o.layout.pp))
        return tg_refuse(r, "%s", dl_errmsg());
    return TG_NEXT;
}

static void j_dp(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.layout.dp); }
static void j_tp(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.layout.tp); }
static void j_pp(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.layout.pp); }

/* clang-format off */
static const tg_opt opts[] = {
    {"dp", 1, p_dp,
"  --dp N                data-parallel ranks (default: number of cores / (tp x pp))\n"},
    {"tp", 1, p_tp,
"  --tp N                tensor-parallel ranks; must divide --heads (default 1)\n"},
    {"pp", 1, p_pp,
"  --pp N                pipeline stages; at most --layers (default 1)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_RESOLVE, world}, {TG_RESOLVE, resolve}, {0}};
static const tg_field config[] = {{"dp", j_dp, NULL}, {"tp", j_tp, NULL}, {"pp", j_pp, NULL}, {0}};

const tg_group tg_layout = {.heading = "Layout:\n",
                            .opts = opts,
                            .hooks = hooks,
                            .init = init,
                            .config = config};
