/* Unit tests of the core layer's private helpers (lib/core/): bf16 rounding, the string
 * builder, JSON string escaping, the median and the pipeline grid's rows. Each is checked against
 * a reference written here independently of the code: bf16 from the two neighbouring bf16 values
 * and their distances (not the bit trick the library uses), strings against literal text. */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/bf16.h"
#include "core/grid.h"
#include "core/json.h"
#include "core/stats.h"
#include "core/strbuf.h"
#include "model/ops.h"

/* ---- bf16 ---------------------------------------------------------------------------------- */

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value of a non-NaN bf16 pattern from its fields: sign, 8-bit exponent, 7-bit fraction. */
static double bf16_value(uint32_t b)
{
    int sign = (b >> 15) & 1, e = (b >> 7) & 0xff, frac = b & 0x7f;
    double v = e == 0xff ? INFINITY
               : e == 0  ? ldexp(frac, -126 - 7)
                         : ldexp(128 + frac, e - 127 - 7);
    return sign ? -v : v;
}

/* Round to nearest, ties to even, of a non-NaN f32 pattern u: of the two bf16 values around x
 * (the one toward zero, lo, and the next one away from zero, hi = lo + 1 in bits, which is
 * infinity past the largest finite), the nearer one; at a tie the one with an even fraction. */
static uint16_t ref_round(uint32_t u)
{
    double x = f32_of(u);
    uint32_t lo = u >> 16, hi = lo + 1;
    if ((lo & 0x7fff) == 0x7f80)
        return (uint16_t)lo; /* infinity stays */
    double dlo = fabs(x - bf16_value(lo));
    double dhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1, 128) - fabs(x) : fabs(bf16_value(hi) - x);
    if (dlo != dhi)
        return (uint16_t)(dlo < dhi ? lo : hi);
    return (uint16_t)(lo & 1 ? hi : lo);
}

static int is_nan_pattern(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* The f32 patterns tried: every upper half with the lower halves that decide a rounding (exact,
 * just below and at and above the midpoint, the largest) and two others. This covers zeros,
 * subnormals, the largest finite values, infinities and NaNs of both signs. */
static const uint32_t LOWS[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};

START_TEST(test_bf16_round_reference)
{
    long cases = 0, trunc_differs = 0, ties = 0, ties_odd = 0;
    for (uint32_t hiw = 0; hiw < 0x10000; hiw++)
        for (size_t k = 0; k < sizeof LOWS / sizeof LOWS[0]; k++) {
            uint32_t u = hiw << 16 | LOWS[k];
            uint16_t got = dl__bf16_round(f32_of(u));
            ck_assert_uint_eq(dl_f32_to_bf16(f32_of(u)), got); /* the public name is the same */
            cases++;
            if (is_nan_pattern(u)) {
                /* still a NaN, quiet, sign and the top of the payload kept */
                ck_assert_msg((got & 0x7f80) == 0x7f80 && (got & 0x40), "NaN 0x%08x -> 0x%04x", u,
                              got);
                ck_assert_uint_eq(got & 0xffbf, (u >> 16) & 0xffbf);
                continue;
            }
            uint16_t want = ref_round(u);
            ck_assert_msg(got == want, "f32 0x%08x: bf16 0x%04x, want 0x%04x", u, got, want);
            trunc_differs += want != (uint16_t)(u >> 16);
            if (LOWS[k] == 0x8000 && (u & 0x7f800000u) != 0x7f800000u) {
                ties++;
                ties_odd += (u >> 16) & 1;
            }
        }
    /* negative controls: the cases would catch truncation and ties away from zero */
    ck_assert_int_gt(trunc_differs, cases / 4);
    ck_assert_int_gt(ties_odd, 0);
    ck_assert_int_gt(ties - ties_odd, 0);
}
END_TEST

START_TEST(test_bf16_edges)
{
    /* written out by hand */
    ck_assert_uint_eq(dl__bf16_round(1.0f), 0x3f80);
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x3f808000u)), 0x3f80); /* tie, even kept half */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x3f818000u)), 0x3f82); /* tie, odd: up to even */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x3f808001u)), 0x3f81); /* above the tie */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x7f7f7fffu)), 0x7f7f); /* max finite stays */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x7f7f8000u)), 0x7f80); /* tie, odd: to infinity */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0xff7f8000u)), 0xff80);
    ck_assert_uint_eq(dl__bf16_round(INFINITY), 0x7f80);
    ck_assert_uint_eq(dl__bf16_round(-INFINITY), 0xff80);
    ck_assert_uint_eq(dl__bf16_round(-0.0f), 0x8000);
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x00008000u)), 0x0000); /* subnormal tie, even */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x00018000u)), 0x0002);
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x007fffffu)), 0x0080); /* up to the smallest normal */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0x7f800001u)), 0x7fc0); /* NaN, not infinity */
    ck_assert_uint_eq(dl__bf16_round(f32_of(0xffffffffu)), 0xffff);
    ck_assert_uint_eq(dl__bf16_round(NAN) & 0x7fc0, 0x7fc0);
}
END_TEST

START_TEST(test_bf16_widen)
{
    for (uint32_t b = 0; b < 0x10000; b++) {
        float w = dl__bf16_widen((uint16_t)b);
        float pub = dl_bf16_to_f32((uint16_t)b); /* the public name: the same bits */
        ck_assert_int_eq(memcmp(&pub, &w, 4), 0);
        if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) {
            ck_assert(isnan(w));
            continue;
        }
        ck_assert_msg((double)w == bf16_value(b), "bf16 0x%04x widened to %a", b, (double)w);
        ck_assert_int_eq(signbit(w) != 0, (b >> 15) & 1);
        ck_assert_uint_eq(dl__bf16_round(w), b); /* widening is exact: it rounds back */
    }
    /* the array kernels use the same rounding */
    float src[4] = {1.0f, f32_of(0x3f818000u), f32_of(0x7f7f8000u), f32_of(0x7f800001u)};
    uint16_t dst[4];
    dl_bf16_from_f32(dst, src, 4);
    ck_assert_uint_eq(dst[0], 0x3f80);
    ck_assert_uint_eq(dst[1], 0x3f82);
    ck_assert_uint_eq(dst[2], 0x7f80);
    ck_assert_uint_eq(dst[3], 0x7fc0);
}
END_TEST

/* ---- string builder ------------------------------------------------------------------------- */

START_TEST(test_strbuf_growth)
{
    dl__strbuf b = {0};
    char want[5001];
    for (int i = 0; i < 5000; i++) {
        want[i] = (char)('a' + i % 26);
        dl__sb_add(&b, &want[i], 1);
        ck_assert_uint_eq(b.n, (size_t)i + 1);
        ck_assert_uint_ge(b.cap, b.n + 1);
        ck_assert_int_eq(b.p[b.n], '\0');
    }
    want[5000] = '\0';
    ck_assert_str_eq(b.p, want);
    /* printf output longer than any fixed buffer, and into the middle of the string */
    dl__sb_printf(&b, "[%s|%d]", want, 42);
    dl__sb_str(&b, "end");
    char *s = NULL;
    ck_assert_int_eq(dl__sb_finish(&b, &s, "test"), DL_OK);
    ck_assert_uint_eq(strlen(s), 5000 + 1 + 5000 + 4 + 3);
    ck_assert_int_eq(strncmp(s, want, 5000), 0);
    ck_assert_int_eq(strncmp(s + 5000, "[", 1), 0);
    ck_assert_int_eq(strncmp(s + 5001, want, 5000), 0);
    ck_assert_str_eq(s + 10001, "|42]end");
    ck_assert_ptr_null(b.p); /* handed over */
    free(s);
}
END_TEST

START_TEST(test_strbuf_empty)
{
    dl__strbuf b = {0};
    char *s = NULL;
    ck_assert_int_eq(dl__sb_finish(&b, &s, "test"), DL_OK);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "");
    free(s);
}
END_TEST

START_TEST(test_strbuf_overflow)
{
    dl__strbuf b = {0};
    dl__sb_str(&b, "kept until the end");
    /* a length that cannot fit: refused before any byte is read from the source */
    dl__sb_add(&b, "x", SIZE_MAX);
    ck_assert_int_eq(b.oom, 1);
    ck_assert_uint_eq(b.n, strlen("kept until the end"));
    dl__sb_str(&b, "more"); /* no-ops once failed */
    dl__sb_printf(&b, "%d", 7);
    ck_assert_uint_eq(b.n, strlen("kept until the end"));
    char *s = (char *)"untouched";
    dl_error_clear();
    ck_assert_int_eq(dl__sb_finish(&b, &s, "caption"), DL_ENOMEM);
    ck_assert_str_eq(s, "untouched");
    ck_assert_str_eq(dl_errmsg(), "caption: out of memory");
    ck_assert_ptr_null(b.p); /* freed */
    /* lengths where n + len + 1 wraps around to 0 and to a small size */
    for (size_t extra = 1; extra <= 3; extra++) {
        dl__strbuf c = {0};
        dl__sb_str(&c, "ab");
        dl__sb_add(&c, "x", SIZE_MAX - c.n - 1 + extra);
        ck_assert_int_eq(c.oom, 1);
        ck_assert_int_eq(dl__sb_finish(&c, &s, "grid"), DL_ENOMEM);
        ck_assert_str_eq(dl_errmsg(), "grid: out of memory");
    }
}
END_TEST

/* ---- JSON strings --------------------------------------------------------------------------- */

/* dl__json_fputs's output as a string (the caller frees it). */
static char *json_file(const char *s, dl__json_ctrl ctrl)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    ck_assert_ptr_nonnull(f);
    dl__json_fputs(f, s, ctrl);
    fclose(f);
    return out;
}

static char *json_sb(const char *s, dl__json_ctrl ctrl)
{
    dl__strbuf b = {0};
    dl__sb_json(&b, s, ctrl);
    char *out = NULL;
    ck_assert_int_eq(dl__sb_finish(&b, &out, "json"), DL_OK);
    return out;
}

static void expect_json(const char *in, dl__json_ctrl ctrl, const char *want)
{
    char *a = json_file(in, ctrl), *b = json_sb(in, ctrl);
    ck_assert_str_eq(a, want);
    ck_assert_str_eq(b, want);
    free(a);
    free(b);
}

START_TEST(test_json_escaping)
{
    /* quote, backslash, control characters, UTF-8 (U+00E9, U+00B7) and DEL passed through */
    const char *in = "a\"b\\c\n\t\x01\x1f \xC3\xA9\xC2\xB7\x7f/";
    expect_json(in, DL__JSON_CTRL_U,
                "\"a\\\"b\\\\c\\u000a\\u0009\\u0001\\u001f \xC3\xA9\xC2\xB7\x7f/\"");
    expect_json(in, DL__JSON_CTRL_NL,
                "\"a\\\"b\\\\c\\n\\u0009\\u0001\\u001f \xC3\xA9\xC2\xB7\x7f/\"");
    expect_json(in, DL__JSON_CTRL_DROP, "\"a\\\"b\\\\c \xC3\xA9\xC2\xB7\x7f/\"");
    expect_json("", DL__JSON_CTRL_U, "\"\"");
    expect_json(NULL, DL__JSON_CTRL_U, "\"\"");
    /* every byte, one at a time, against the rule written out here */
    for (int c = 1; c < 256; c++) {
        char e[8], want[8];
        size_t n = dl__json_escape((unsigned char)c, DL__JSON_CTRL_U, e);
        if (c == '"' || c == '\\')
            snprintf(want, sizeof want, "\\%c", c);
        else if (c < 0x20)
            snprintf(want, sizeof want, "\\u00%c%c", "0123456789abcdef"[c >> 4],
                     "0123456789abcdef"[c & 15]);
        else
            snprintf(want, sizeof want, "%c", c);
        ck_assert_str_eq(e, want);
        ck_assert_uint_eq(n, strlen(want));
        n = dl__json_escape((unsigned char)c, DL__JSON_CTRL_DROP, e);
        ck_assert_uint_eq(n, c < 0x20 ? 0 : strlen(want));
        ck_assert_uint_eq(strlen(e), n);
    }
}
END_TEST

/* ---- median --------------------------------------------------------------------------------- */

START_TEST(test_median)
{
    double odd[] = {5, 1, 3}, even[] = {5, 1, 3, 2}, one[] = {-7}, dup[] = {2, 2, 9, 2};
    const double keep[] = {4, 8, 1, 6};
    ck_assert_double_eq(dl__median_copy(keep, 4), 5.0);
    ck_assert_double_eq(keep[0], 4.0); /* the copy variant leaves its input alone */
    ck_assert_double_eq(keep[1], 8.0);
    ck_assert_double_eq(dl__median(odd, 3), 3.0);
    ck_assert_double_eq(dl__median(even, 4), 2.5);
    ck_assert_double_eq(even[0], 1.0); /* sorted in place, ascending */
    ck_assert_double_eq(even[3], 5.0);
    ck_assert_double_eq(dl__median(one, 1), -7.0);
    ck_assert_double_eq(dl__median(dup, 4), 2.0);
    ck_assert(isnan(dl__median(NULL, 0)));
    ck_assert(isnan(dl__median_copy(NULL, 0)));
    ck_assert(isnan(dl__median(odd, 0)));
}
END_TEST

/* ---- grid rows ------------------------------------------------------------------------------ */

START_TEST(test_grid)
{
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, 0), '0');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, 9), '9');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, 10), 'A');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, 35), 'Z');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, 36), '+');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_FWD, -1), '+');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_BWD, 0), 'a');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_BWD, 25), 'z');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_BWD, 26), '-');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_BWD, -1), '-');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_OPT, 3), '*');
    ck_assert_int_eq(dl__grid_mark(DL__GRID_COMM, 3), '=');
    ck_assert_int_eq(dl__grid_label_width(1), 1);
    ck_assert_int_eq(dl__grid_label_width(9), 1);
    ck_assert_int_eq(dl__grid_label_width(10), 2);
    ck_assert_int_eq(dl__grid_label_width(100), 3);
    dl__strbuf b = {0};
    const char cells[] = {'0', 0, 'a', '*'};
    dl__grid_row(&b, 0, 1, cells, 4);
    dl__grid_row(&b, 9, 2, cells, 2);
    dl__grid_label(&b, 2, 2);
    char *s = NULL;
    ck_assert_int_eq(dl__sb_finish(&b, &s, "grid"), DL_OK);
    ck_assert_str_eq(s, "GPU 1  0\xC2\xB7"
                        "a*\nGPU 10  0\xC2\xB7\nGPU 3  ");
    free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bf16_round_reference);
    tcase_add_test(tc, test_bf16_edges);
    tcase_add_test(tc, test_bf16_widen);
    tcase_add_test(tc, test_strbuf_growth);
    tcase_add_test(tc, test_strbuf_empty);
    tcase_add_test(tc, test_strbuf_overflow);
    tcase_add_test(tc, test_json_escaping);
    tcase_add_test(tc, test_median);
    tcase_add_test(tc, test_grid);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
