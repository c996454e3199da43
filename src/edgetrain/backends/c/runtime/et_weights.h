/* edgetrain C runtime (host): the weights file and the samples file of a host project, whose
 * format backends/c/weights_file.py describes and writes. Included by the standalone driver
 * (main.c); includes model.h: it loads and saves the state through model.h's state I/O
 * (et_state_ptr: read in place, no second copy; else et_set_state / et_get_state), and reads
 * one sample at a time, so neither the weights nor the samples are held twice.
 * Built with ET_MAP_WEIGHTS=1 (the standalone Makefile's default on Linux), the frozen tensors are
 * not read: the file is mapped read-only and they point into it (et_bind_state); model.c drops
 * their pages after use, and et_save_weights writes them from the mapping a chunk at a time,
 * dropping each chunk's pages, so they are never resident whole. Without a mapping (mmap
 * refused) they are read into memory of their own, as before.
 * Every function returns 0 or -1 with a message in err (which file, what is wrong); after a failed
 * et_load_weights the state is partly overwritten: the caller stops. Each tensor's offset (aligned,
 * after the table, after the tensor before it, inside the file) and the CRC-32 of its bytes are
 * checked (weights_file.py states the format); a mapped tensor's CRC is summed a MiB at a time,
 * each MiB's pages dropped after, so the check never holds the file resident.
 * The samples file: its size is its header's count of records, and with ET_LABEL_CLASSES defined
 * (main.c, for the class losses) every label of every sample is checked at open. */
#ifndef ET_WEIGHTS_H
#define ET_WEIGHTS_H
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model.h" /* the program's state I/O: et_num_state, et_state_ptr, et_bind_state, ... */

#ifndef ET_MAP_WEIGHTS
#define ET_MAP_WEIGHTS 0
#endif
#if ET_MAP_WEIGHTS
#include <fcntl.h>
#include <sys/mman.h>
#endif

#define ET_FILE_VERSION 2u
#define ET_SAMPLES_VERSION 1u
#define ET_FILE_HEADER 64
#define ET_FILE_ENTRY 32 /* u32 name bytes, u32 dtype code, u64 bytes, u64 offset, u32 CRC-32 of the data, u32 0 */
#define ET_FILE_ALIGN 64 /* every tensor's data at a multiple of this (weights_file.DATA_ALIGN) */
#define ET_CRC_CHUNK (1u << 20) /* a mapped tensor's CRC is summed (and its pages dropped) this many bytes at a time */

static uint32_t et_rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t et_rd64(const unsigned char *p) { return (uint64_t)et_rd32(p) | (uint64_t)et_rd32(p + 4) << 32; }

static int et_file_fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t et_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

/* FNV-1a 64 of this program's (state name, 0, byte size as 8 bytes little endian) in order */
static uint64_t et_weights_table_hash(void) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int i = 0; i < et_num_state(); ++i) {
        const char *name = et_state_name(i);
        unsigned char le[8];
        uint64_t nb = (uint64_t)et_state_bytes(i);
        for (int k = 0; k < 8; ++k) le[k] = (unsigned char)(nb >> (8 * k));
        h = et_fnv(h, name, strlen(name) + 1);
        h = et_fnv(h, le, 8);
    }
    return h;
}

/* CRC-32 as zlib's crc32 (ISO-HDLC: reflected 0xEDB88320, initial and final xor 0xFFFFFFFF): start
   with crc 0, pass the result on to sum more bytes; slicing by 4, the tables made on first use */
static uint32_t et_crc_tab[4][256];
static uint32_t et_crc32(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    if (!et_crc_tab[0][1]) {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = c & 1u ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            et_crc_tab[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int t = 1; t < 4; ++t) et_crc_tab[t][i] = (et_crc_tab[t - 1][i] >> 8) ^ et_crc_tab[0][et_crc_tab[t - 1][i] & 255u];
    }
    crc = ~crc;
    for (; n >= 4; n -= 4, b += 4) {
        crc ^= (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        crc = et_crc_tab[3][crc & 255u] ^ et_crc_tab[2][(crc >> 8) & 255u] ^ et_crc_tab[1][(crc >> 16) & 255u]
              ^ et_crc_tab[0][crc >> 24];
    }
    while (n--) crc = (crc >> 8) ^ et_crc_tab[0][(crc ^ *b++) & 255u];
    return ~crc;
}

/* why tensor data at off (nbytes) breaks the format, or 0 (weights_file.data_offset_problem): the header
   and table end at table_end, the tensor before it in the table at prev_end (0 for the first), the file at size */
static const char *et_offset_problem(uint64_t off, uint64_t nbytes, uint64_t table_end, uint64_t prev_end,
                                     uint64_t size) {
    if (off % ET_FILE_ALIGN) return "not 64-byte aligned";
    if (off < table_end) return "inside the header or table";
    if (off < prev_end) return "overlaps the tensor before it";
    if (off > size || nbytes > size - off) return "its bytes run past the end of the file";
    return 0;
}

static int et_crc_fail(char *err, size_t n, const char *path, const char *name, uint32_t got, uint32_t want) {
    return et_file_fail(err, n, "%s: tensor %s: its data do not match its checksum (CRC-32 %08x, the table says "
                        "%08x): the file is damaged", path, name, (unsigned)got, (unsigned)want);
}

static long long et_file_size(FILE *f) {
    if (fseek(f, 0, SEEK_END) != 0) return -1;
    long long n = ftell(f);
    return fseek(f, 0, SEEK_SET) == 0 ? n : -1;
}

/* the header and table of the weights file last loaded: et_save_weights writes them back */
static unsigned char *et_wtable;
static size_t et_wtable_bytes;
static uint64_t et_wfile_bytes;

#if ET_MAP_WEIGHTS
/* the weights file mapped read-only (kept for the program's life: its frozen tensors point into it) */
static unsigned char *et_wmap;
static size_t et_wmap_bytes;
/* per state tensor: 1 when it points into et_wmap, 2 when it was bound to memory of its own */
static unsigned char *et_wbound;

/* drop the mapping's pages of [p, p + n) and of the 2 MiB before it (a fault maps the page cache's folio
   around the page it needs: pages dropped before come back), read again from the file when next used */
static void et_wmap_release(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)et_wmap;
    uintptr_t a = (uintptr_t)p > lo + (2u << 20) ? (uintptr_t)p - (2u << 20) : lo;
    uintptr_t b = (uintptr_t)p + n < lo + et_wmap_bytes ? (uintptr_t)p + n : lo + et_wmap_bytes;
    a &= ~(pg - 1), b = (b + pg - 1) & ~(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* map path read-only; 0 without a mapping (the caller reads every tensor instead) */
static unsigned char *et_wmap_open(const char *path, size_t bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    void *m = mmap(0, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file */
    return m == MAP_FAILED ? 0 : (unsigned char *)m;
}

/* the CRC-32 of a tensor's bytes in the mapping, a chunk at a time, each chunk's pages dropped after it */
static uint32_t et_wmap_crc(const unsigned char *p, size_t nbytes) {
    uint32_t crc = 0;
    for (size_t k = 0; k < nbytes; k += ET_CRC_CHUNK) {
        const size_t c = nbytes - k < ET_CRC_CHUNK ? nbytes - k : ET_CRC_CHUNK;
        crc = et_crc32(crc, p + k, c);
        et_wmap_release(p + k, c);
    }
    return crc;
}

/* bind frozen tensor i to the file's bytes at off, whose CRC-32 must be crc: in the mapping, else in
   memory of its own read from f; 1 when it is such a tensor and bound, 0 when it is not one (read it as
   any other), -1 on a read error, -2 when its bytes do not match crc (*got: their CRC) */
static int et_wmap_bind(int i, FILE *f, uint64_t off, size_t nbytes, uint32_t crc, uint32_t *got) {
    if (et_wmap && et_bind_state(i, 0, 0) == 0) { /* a frozen tensor: summed before it is bound */
        if ((*got = et_wmap_crc(et_wmap + off, nbytes)) != crc) return -2;
        et_bind_state(i, et_wmap + off, 1);
        et_wbound[i] = 1;
        return 1;
    }
    if (et_bind_state(i, 0, 0) != 0) return 0; /* not a frozen tensor of this build */
    void *buf = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
    if (!buf || fseek(f, (long)off, SEEK_SET) != 0 || fread(buf, 1, nbytes, f) != nbytes) {
        free(buf);
        return -1;
    }
    if ((*got = et_crc32(0, buf, nbytes)) != crc) {
        free(buf);
        return -2;
    }
    et_bind_state(i, buf, 0);
    et_wbound[i] = 2;
    return 1;
}
#endif

/* read the weights file at path into the program's state tensors, after checking that it is
   one (magic, version), that it is whole (its size) and that it is this program's (tensor
   count, table hash, each tensor's name and size) */
int et_load_weights(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return et_file_fail(err, errlen, "cannot open the weights file %s: %s", path, strerror(errno));
    unsigned char h[ET_FILE_HEADER];
    long long size = et_file_size(f);
    int rc = -1;
    unsigned char *tab = 0;
    uint64_t *offs = 0;
    uint32_t *crcs = 0;
    if (size < ET_FILE_HEADER || fread(h, 1, ET_FILE_HEADER, f) != ET_FILE_HEADER) {
        et_file_fail(err, errlen, "%s: short file (%lld B): not a weights file", path, size);
        goto done;
    }
    if (memcmp(h, "ETWEIGHT", 8) != 0) {
        et_file_fail(err, errlen, "%s: not an edgetrain weights file (bad magic)", path);
        goto done;
    }
    if (et_rd32(h + 8) != ET_FILE_VERSION) {
        et_file_fail(err, errlen, "%s: weights format version %u; this program reads version %u (emit the project "
                     "again)", path, et_rd32(h + 8), ET_FILE_VERSION);
        goto done;
    }
    const uint32_t count = et_rd32(h + 12);
    const uint64_t hash = et_rd64(h + 16), want = et_rd64(h + 24);
    if ((uint64_t)size != want) {
        et_file_fail(err, errlen, "%s: %lld B, its header says %llu B (truncated or damaged)", path, size,
                     (unsigned long long)want);
        goto done;
    }
    if (count != (uint32_t)et_num_state() || hash != et_weights_table_hash()) {
        et_file_fail(err, errlen, "%s: the weights of another model (%u tensors; this program has %d, or their "
                     "names or sizes differ)", path, count, et_num_state());
        goto done;
    }
    size_t cap = ET_FILE_HEADER + (size_t)count * (ET_FILE_ENTRY + 64), used = ET_FILE_HEADER;
    tab = (unsigned char *)malloc(cap);
    offs = (uint64_t *)malloc(sizeof(uint64_t) * (count ? count : 1));
    crcs = (uint32_t *)malloc(sizeof(uint32_t) * (count ? count : 1));
    if (!tab || !offs || !crcs) { et_file_fail(err, errlen, "%s: out of memory for its table", path); goto done; }
    memcpy(tab, h, ET_FILE_HEADER);
    for (uint32_t i = 0; i < count; ++i) { /* the table: each entry this program's tensor i */
        unsigned char e[ET_FILE_ENTRY];
        if (fread(e, 1, ET_FILE_ENTRY, f) != ET_FILE_ENTRY) { et_file_fail(err, errlen, "%s: short table", path); goto done; }
        const char *name = et_state_name((int)i);
        const size_t len = strlen(name);
        const uint32_t n = et_rd32(e);
        if (n != len) { /* checked before the name is read: a damaged length neither wraps nor reads past it */
            et_file_fail(err, errlen, "%s: tensor %u has a name of %u B, this program's is %s (%zu B)", path, i, n,
                         name, len);
            goto done;
        }
        const size_t padded = (len + 7u) & ~(size_t)7u;
        const uint64_t nbytes = et_rd64(e + 8);
        if (used + ET_FILE_ENTRY + padded > cap) {
            unsigned char *t = (unsigned char *)realloc(tab, cap = 2 * cap + ET_FILE_ENTRY + padded);
            if (!t) { et_file_fail(err, errlen, "%s: out of memory for its table", path); goto done; }
            tab = t;
        }
        memcpy(tab + used, e, ET_FILE_ENTRY);
        used += ET_FILE_ENTRY;
        if (fread(tab + used, 1, padded, f) != padded) { et_file_fail(err, errlen, "%s: short table", path); goto done; }
        if (memcmp(tab + used, name, len) != 0 || nbytes != (uint64_t)et_state_bytes((int)i)) {
            et_file_fail(err, errlen, "%s: tensor %u is %.*s (%llu B), this program's is %s (%ld B)", path, i,
                         (int)len, (const char *)(tab + used), (unsigned long long)nbytes, name,
                         et_state_bytes((int)i));
            goto done;
        }
        used += padded;
        offs[i] = et_rd64(e + 16), crcs[i] = et_rd32(e + 24);
    }
    for (uint32_t i = 0; i < count; ++i) { /* the data's places: as the format states */
        const uint64_t nbytes = (uint64_t)et_state_bytes((int)i);
        const char *bad = et_offset_problem(offs[i], nbytes, used, i ? offs[i - 1] + (uint64_t)et_state_bytes((int)i - 1)
                                            : 0, want);
        if (bad) {
            et_file_fail(err, errlen, "%s: tensor %s: data offset %llu: %s", path, et_state_name((int)i),
                         (unsigned long long)offs[i], bad);
            goto done;
        }
    }
    rc = 0;
#if ET_MAP_WEIGHTS
    if (count) {
        if (et_wmap) munmap(et_wmap, et_wmap_bytes);
        free(et_wbound);
        et_wmap = et_wmap_open(path, et_wmap_bytes = (size_t)want);
        if (et_wmap) et_weight_map_range(et_wmap, et_wmap_bytes);
        et_wbound = (unsigned char *)calloc(count, 1);
        if (!et_wbound) rc = et_file_fail(err, errlen, "%s: out of memory", path);
    }
#endif
    for (uint32_t i = 0; rc == 0 && i < count; ++i) { /* the data, in place where the array is whole */
        const size_t nbytes = (size_t)et_state_bytes((int)i);
        const char *name = et_state_name((int)i);
        uint32_t got = 0;
#if ET_MAP_WEIGHTS
        const int bound = et_wmap_bind((int)i, f, offs[i], nbytes, crcs[i], &got); /* frozen: mapped, not read */
        if (bound == -1) rc = et_file_fail(err, errlen, "%s: cannot read tensor %s", path, name);
        if (bound == -2) rc = et_crc_fail(err, errlen, path, name, got, crcs[i]);
        if (bound) continue;
#endif
        void *dst = et_state_ptr((int)i), *buf = dst ? dst : malloc(nbytes ? nbytes : 1);
        if (!buf || fseek(f, (long)offs[i], SEEK_SET) != 0 || fread(buf, 1, nbytes, f) != nbytes) {
            rc = et_file_fail(err, errlen, "%s: cannot read tensor %s", path, name);
        } else if ((got = et_crc32(0, buf, nbytes)) != crcs[i]) {
            rc = et_crc_fail(err, errlen, path, name, got, crcs[i]);
        } else if (!dst && et_set_state((int)i, buf) != 0) {
            rc = et_file_fail(err, errlen, "%s: cannot set tensor %s", path, name);
        }
        if (!dst) free(buf);
    }
    if (rc == 0) {
        free(et_wtable);
        et_wtable = tab, et_wtable_bytes = used, et_wfile_bytes = want;
        tab = 0;
    }
done:
    free(tab);
    free(offs);
    free(crcs);
    fclose(f);
    return rc;
}

/* the first float32 state tensor (dtype code 1 in the table of the file loaded) holding a nan or an inf, as
   its index + 1, else 0 (mapped frozen tensors, never written, are skipped); -1 when one cannot be read.
   main.c refuses to save weights for which this is not 0 */
int et_weights_nonfinite(void) {
    const unsigned char *e = et_wtable ? et_wtable + ET_FILE_HEADER : 0;
    for (int i = 0; e && i < et_num_state(); ++i) {
        const uint32_t code = et_rd32(e + 4), padded = (et_rd32(e) + 7u) & ~7u;
        const uint64_t nbytes = et_rd64(e + 8);
        e += ET_FILE_ENTRY + padded;
        if (code != 1) continue;
#if ET_MAP_WEIGHTS
        if (et_wbound && et_wbound[i]) continue;
#endif
        const unsigned char *p = (const unsigned char *)et_state_ptr(i);
        void *buf = 0;
        if (!p) {
            buf = malloc(nbytes ? (size_t)nbytes : 1);
            if (!buf || et_get_state(i, buf) != 0) { free(buf); return -1; }
            p = (const unsigned char *)buf;
        }
        uint32_t acc = 0;
        for (uint64_t k = 0; k + 4 <= nbytes; k += 4) {
            uint32_t u;
            memcpy(&u, p + k, 4);
            acc |= (u & 0x7f800000u) == 0x7f800000u;
        }
        free(buf);
        if (acc) return i + 1;
    }
    return 0;
}

static void et_wr32(unsigned char *p, uint32_t v) { for (int k = 0; k < 4; ++k) p[k] = (unsigned char)(v >> (8 * k)); }
static void et_wr64(unsigned char *p, uint64_t v) { et_wr32(p, (uint32_t)v); et_wr32(p + 4, (uint32_t)(v >> 32)); }

/* write the state as it is now to path, in the layout of the file last loaded, each tensor's CRC-32
   that of the bytes written (summed as they are written; the table written again after them;
   written to path.tmp, flushed to disk, then renamed: a crash leaves the old file whole) */
int et_save_weights(const char *path, char *err, size_t errlen) {
    if (!et_wtable) return et_file_fail(err, errlen, "%s: no weights file was loaded to take the layout of", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return et_file_fail(err, errlen, "path too long");
    FILE *f = fopen(tmp, "wb");
    if (!f) return et_file_fail(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    int ok = fwrite(et_wtable, 1, et_wtable_bytes, f) == et_wtable_bytes;
    unsigned char *e = et_wtable + ET_FILE_HEADER;
    uint64_t at = et_wtable_bytes;
    for (int i = 0; ok && i < et_num_state(); ++i) {
        const uint32_t padded = (et_rd32(e) + 7u) & ~7u;
        const uint64_t nbytes = et_rd64(e + 8), off = et_rd64(e + 16);
        unsigned char *crc_at = e + 24;
        e += ET_FILE_ENTRY + padded;
        for (; ok && at < off; ++at) ok = fputc(0, f) != EOF;
        void *src = et_state_ptr(i);
#if ET_MAP_WEIGHTS
        if (ok && src && et_wbound && et_wbound[i] == 1) { /* from the mapping, dropping each chunk's pages */
            uint32_t crc = 0;
            for (uint64_t k = 0; ok && k < nbytes; k += ET_CRC_CHUNK) {
                const size_t c = (size_t)(nbytes - k < ET_CRC_CHUNK ? nbytes - k : ET_CRC_CHUNK);
                ok = fwrite((const unsigned char *)src + k, 1, c, f) == c;
                crc = et_crc32(crc, (const unsigned char *)src + k, c);
                et_wmap_release((const unsigned char *)src + k, c);
            }
            et_wr32(crc_at, crc);
            at += nbytes;
            continue;
        }
#endif
        void *buf = src ? src : malloc(nbytes ? nbytes : 1);
        ok = ok && buf && (src || et_get_state(i, buf) == 0) && fwrite(buf, 1, nbytes, f) == nbytes;
        if (ok) et_wr32(crc_at, et_crc32(0, buf, (size_t)nbytes));
        if (!src) free(buf);
        at += nbytes;
    }
    for (; ok && at < et_wfile_bytes; ++at) ok = fputc(0, f) != EOF;
    ok = ok && fseek(f, 0, SEEK_SET) == 0 && fwrite(et_wtable, 1, et_wtable_bytes, f) == et_wtable_bytes; /* the CRCs */
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok && rename(tmp, path) == 0;
    if (!ok) {
        remove(tmp);
        return et_file_fail(err, errlen, "cannot write the weights to %s: %s", path, strerror(errno));
    }
    return 0;
}

/* write count tensors (name, dtype code of weights_file.DTYPE_CODES, bytes, data) to path in
   the weights file format (weights_file.weights_blob's layout: read_weights reads it), via
   path.tmp renamed when whole; the gradients of --save-grads */
int et_save_tensors(const char *path, int count, const char *const *names, const uint32_t *codes,
                    const long *nbytes, void *const *data, char *err, size_t errlen) {
    uint64_t h = 0xCBF29CE484222325ull, table_end = ET_FILE_HEADER;
    for (int i = 0; i < count; ++i) {
        unsigned char le[8];
        et_wr64(le, (uint64_t)nbytes[i]);
        h = et_fnv(et_fnv(h, names[i], strlen(names[i]) + 1), le, 8);
        table_end += ET_FILE_ENTRY + ((strlen(names[i]) + 7u) & ~(size_t)7u);
    }
    uint64_t end = (table_end + 63) & ~63ull;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return et_file_fail(err, errlen, "path too long");
    FILE *f = fopen(tmp, "wb");
    if (!f) return et_file_fail(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    unsigned char head[ET_FILE_HEADER] = {0}, e[ET_FILE_ENTRY], zeros[64] = {0};
    uint64_t at = end;
    for (int i = 0; i < count; ++i) at = (at + (uint64_t)nbytes[i] + 63) & ~63ull;
    memcpy(head, "ETWEIGHT", 8);
    et_wr32(head + 8, ET_FILE_VERSION), et_wr32(head + 12, (uint32_t)count), et_wr64(head + 16, h), et_wr64(head + 24, at);
    int ok = fwrite(head, 1, ET_FILE_HEADER, f) == ET_FILE_HEADER;
    for (int i = 0; ok && i < count; ++i) {
        const size_t n = strlen(names[i]), padded = (n + 7u) & ~(size_t)7u;
        et_wr32(e, (uint32_t)n), et_wr32(e + 4, codes[i]), et_wr64(e + 8, (uint64_t)nbytes[i]), et_wr64(e + 16, end);
        et_wr32(e + 24, et_crc32(0, data[i], (size_t)nbytes[i])), et_wr32(e + 28, 0);
        ok = fwrite(e, 1, ET_FILE_ENTRY, f) == ET_FILE_ENTRY && fwrite(names[i], 1, n, f) == n
             && fwrite(zeros, 1, padded - n, f) == padded - n;
        end = (end + (uint64_t)nbytes[i] + 63) & ~63ull;
    }
    uint64_t pos = table_end;
    for (int i = 0; ok && i < count; ++i) {
        const uint64_t off = (pos + 63) & ~63ull;
        ok = fwrite(zeros, 1, (size_t)(off - pos), f) == off - pos && fwrite(data[i], 1, (size_t)nbytes[i], f) == (size_t)nbytes[i];
        pos = off + (uint64_t)nbytes[i];
    }
    ok = ok && fwrite(zeros, 1, (size_t)(at - pos), f) == at - pos;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok && rename(tmp, path) == 0;
    if (!ok) {
        remove(tmp);
        return et_file_fail(err, errlen, "cannot write the tensors to %s: %s", path, strerror(errno));
    }
    return 0;
}

/* a samples file, read one (input, label) record at a time */
typedef struct {
    FILE *f;
    uint32_t count;
} et_samples_t;

#ifdef ET_LABEL_CLASSES
/* every label of every sample a class index in [0, ET_LABEL_CLASSES) or ET_LABEL_IGNORE (main.c defines them
   for the class losses, with ET_LABEL_ELEM the bytes of one: 8, int64, or 4, int32): the loss kernels index
   the logits by them, so a bad one is refused here, naming the sample, before any step */
static int et_samples_check_labels(et_samples_t *s, const char *path, char *err, size_t errlen) {
    static unsigned char lab[ET_LABEL_BYTES];
    for (uint32_t k = 0; k < s->count; ++k) {
        const long long at = ET_FILE_HEADER + (long long)k * (ET_INPUT_BYTES + ET_LABEL_BYTES) + ET_INPUT_BYTES;
        if (fseek(s->f, (long)at, SEEK_SET) != 0 || fread(lab, 1, ET_LABEL_BYTES, s->f) != ET_LABEL_BYTES)
            return et_file_fail(err, errlen, "%s: cannot read the label of sample %u", path, k);
        for (long j = 0; j < ET_LABEL_BYTES / ET_LABEL_ELEM; ++j) {
            const unsigned char *p = lab + j * ET_LABEL_ELEM;
            const int64_t y = ET_LABEL_ELEM == 8 ? (int64_t)et_rd64(p) : (int64_t)(int32_t)et_rd32(p);
            if (y != ET_LABEL_IGNORE && (y < 0 || y >= ET_LABEL_CLASSES))
                return et_file_fail(err, errlen, "%s: sample %u: label %lld (position %ld) is outside [0, %d) and "
                                    "not the ignored label %d", path, k, (long long)y, j, (int)ET_LABEL_CLASSES,
                                    (int)ET_LABEL_IGNORE);
        }
    }
    return 0;
}
#endif

int et_samples_open(et_samples_t *s, const char *path, char *err, size_t errlen) {
    unsigned char h[ET_FILE_HEADER];
    s->f = fopen(path, "rb");
    if (!s->f) return et_file_fail(err, errlen, "cannot open the samples file %s: %s", path, strerror(errno));
    const long long size = et_file_size(s->f);
    const char *bad = 0;
    if (size < ET_FILE_HEADER || fread(h, 1, ET_FILE_HEADER, s->f) != ET_FILE_HEADER) bad = "short file: not a samples file";
    else if (memcmp(h, "ETSAMPLE", 8) != 0) bad = "not an edgetrain samples file (bad magic)";
    else if (et_rd32(h + 8) != ET_SAMPLES_VERSION) bad = "samples format version not 1";
    else if (et_rd64(h + 16) != ET_INPUT_BYTES || et_rd64(h + 24) != ET_LABEL_BYTES)
        bad = "its inputs or labels are not this model's sizes (ET_INPUT_BYTES, ET_LABEL_BYTES)";
    else if ((s->count = et_rd32(h + 12)) == 0) bad = "it holds no sample";
    else if ((uint64_t)size != ET_FILE_HEADER + (uint64_t)s->count * (ET_INPUT_BYTES + ET_LABEL_BYTES))
        bad = "its size is not its header's count of records (truncated?)";
    if (bad) {
        fclose(s->f);
        s->f = 0;
        return et_file_fail(err, errlen, "%s: %s", path, bad);
    }
#ifdef ET_LABEL_CLASSES
    if (et_samples_check_labels(s, path, err, errlen)) {
        fclose(s->f);
        s->f = 0;
        return -1;
    }
#endif
    return 0;
}

int et_samples_read(et_samples_t *s, uint32_t i, void *input, void *label) {
    const long long at = ET_FILE_HEADER + (long long)(i % s->count) * (ET_INPUT_BYTES + ET_LABEL_BYTES);
    return fseek(s->f, (long)at, SEEK_SET) == 0 && fread(input, 1, ET_INPUT_BYTES, s->f) == ET_INPUT_BYTES
           && fread(label, 1, ET_LABEL_BYTES, s->f) == ET_LABEL_BYTES ? 0 : -1;
}
#endif
