/* edgetrain C runtime: secondary storage (flash / SD card / eMMC) for the tensors a paging
 * schedule writes out and reads back (page_out / page_in). Host builds: a file opened by
 * et_page_open(path) (created if missing); every byte moved is counted. Included only by
 * programs that page, in model.c. */
#ifndef ET_PAGE_H
#define ET_PAGE_H
#include <stdio.h>
#include <string.h>

static FILE *et_page_fp;
static long long et_paged_in, et_paged_out;
static int et_page_err; /* set when a read or write failed (no file, short transfer) */

/* 0 on success; -1 if the file cannot be opened for reading and writing */
int et_page_open(const char *path) {
    if (et_page_fp) fclose(et_page_fp);
    et_page_fp = fopen(path, "r+b");
    if (!et_page_fp) et_page_fp = fopen(path, "w+b");
    et_page_err = 0;
    return et_page_fp ? 0 : -1;
}

void et_page_close(void) {
    if (et_page_fp) fclose(et_page_fp);
    et_page_fp = 0;
}

static void et_page_write(long offset, const void *src, size_t n) {
    if (!et_page_fp || fseek(et_page_fp, offset, SEEK_SET) != 0 || fwrite(src, 1, n, et_page_fp) != n) {
        et_page_err = 1;
        return;
    }
    et_paged_out += (long long)n;
}

static void et_page_read(long offset, void *dst, size_t n) {
    /* fseek between a write and a read on one stream, as C requires */
    if (!et_page_fp || fseek(et_page_fp, offset, SEEK_SET) != 0 || fread(dst, 1, n, et_page_fp) != n) {
        et_page_err = 1;
        memset(dst, 0, n);
        return;
    }
    et_paged_in += (long long)n;
}

long long et_paged_in_bytes(void) { return et_paged_in; }
long long et_paged_out_bytes(void) { return et_paged_out; }
int et_page_error(void) { return et_page_err; }
#endif
