/* Tracing: every rank's timeline as Chrome trace JSON, the last step's grid, and the steps
 * traced. */
#include <string.h>
#include "group.h"
#include "cli.h"

static int p_trace(tg_run *r, const char *a)
{
    r->o.trace.path = a;
    return 0;
}

static int p_timeline(tg_run *r, const char *a)
{
    (void)a;
    r->o.trace.timeline = 1;
    return 0;
}

/* A:B or A alone */
static int p_steps(tg_run *r, const char *arg)
{
    const char *colon = strchr(arg, ':');
    char a[32];
    size_t la = colon ? (size_t)(colon - arg) : strlen(arg);
    snprintf(a, sizeof a, "%.*s", (int)(la < sizeof a ? la : sizeof a - 1), arg);
    int bad = cli_parse_int("--trace-steps", a, 1, 1 << 30, &r->o.trace.first) ||
              cli_parse_int("--trace-steps", colon ? colon + 1 : a, 1, 1 << 30, &r->o.trace.last);
    if (!bad && r->o.trace.last < r->o.trace.first) {
        cli_error("--trace-steps: %d:%d ends before it starts", r->o.trace.first, r->o.trace.last);
        bad = 1;
    }
    return bad ? -1 : 0;
}

static int check_steps(tg_run *r)
{
    if (r->o.trace.first && !r->o.trace.path && !r->o.trace.timeline)
        return tg_refuse(r, "--trace-steps needs --trace FILE or --timeline");
    if (r->o.trace.last > r->o.optim.steps)
        return tg_refuse(r, "--trace-steps: step %d is past --steps %d", r->o.trace.last,
                         r->o.optim.steps);
    return TG_NEXT;
}

static int check_output(tg_run *r)
{
    if (r->o.trace.path && cli_check_output("--trace", r->o.trace.path))
        return tg_stop(r, CLI_EXIT_USAGE);
    cli_remove_tmp_on_signal(r->o.trace.path);
    return TG_NEXT;
}

static int timeline(tg_run *run)
{
    if (!run->r->output.timeline)
        return TG_NEXT;
    printf("measured timeline of step %d: ",
           run->o.trace.last ? run->o.trace.last : run->r->nsteps);
    cli_put_ranked(stdout, run->r->output.timeline);
    return TG_NEXT;
}

static int wrote(tg_run *run)
{
    if (run->o.trace.path)
        tg_wrote(run->o.trace.path, "Chrome trace JSON, every rank's events: open it in Perfetto");
    return TG_NEXT;
}

/* clang-format off */
static const tg_opt opts[] = {
    {"trace", 1, p_trace,
"  --trace FILE          write every rank's timeline as Chrome trace JSON (open in Perfetto)\n"},
    {"timeline", 0, p_timeline,
"  --timeline            print the last step's measured timeline as the lecture's grid, with\n"
"                        its legend (every stage's actions listed too when cells merge them)\n"},
    {"trace-steps", 1, p_steps,
"  --trace-steps A:B     trace (--trace, --timeline) only steps A..B (or A alone): the trace\n"
"                        file is written as soon as step B+1 ends, not at the run's end, and\n"
"                        the timeline is step B's\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, check_steps},
                                {TG_FILES, check_output},
                                {TG_REPORT, timeline},
                                {TG_CLOSE, wrote},
                                {0}};

/* under the pipeline's heading: the timeline shows the schedule */
const tg_group tg_trace = {
    .opts = opts,
    .hooks = hooks,
};
