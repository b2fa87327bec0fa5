/* test_lend_wire.c - the peer-GPU tier's control channel (backends/peer_gpu/lend_wire.h): every
 * message round trip, refusals of what is not a message (other versions, types, a region too small
 * for its units, units out of range, trailing bytes, random bytes), and the socket: a HELLO passes
 * a memfd both sides map, a quiet channel times out, a closed one is the peer's death, garbage is
 * refused and the channel stays usable. */
#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/peer_gpu/lend_wire.h"

/* Descriptors this process has open. */
static int open_fds(void) {
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) n += fcntl(fd, F_GETFD) != -1;
    return n;
}

START_TEST(every_message_round_trips) {
    for (uint32_t type = KVS_LEND_HELLO; type <= KVS_LEND_BYE; type++) {
        kvs_lend_msg m = {.type = type, .unit = 7, .epoch = 4000000000u}, back;
        if (type == KVS_LEND_HELLO)
            m.n_units = 3, m.unit_bytes = 1ull << 33, m.region_bytes = 3ull << 33;
        uint8_t buf[KVS_LEND_WIRE_MAX];
        size_t n = kvs_lend_encode(&m, buf);
        ck_assert_uint_gt(n, 0);
        char err[160];
        ck_assert_int_eq(kvs_lend_decode(buf, n, 8, &back, err, sizeof err), KVS_OK);
        ck_assert_mem_eq(&back, &m, sizeof m);
        /* every cut is refused */
        for (size_t cut = 0; cut < n; cut++)
            ck_assert_int_eq(kvs_lend_decode(buf, cut, 8, &back, err, sizeof err), KVS_EINVAL);
    }
    /* a CUDA region's HELLO: its device and its 64-byte IPC handle come back whole */
    kvs_lend_msg cuda = {.type = KVS_LEND_HELLO,
                         .n_units = 9,
                         .unit_bytes = 1ull << 30,
                         .region_bytes = 9ull << 30,
                         .region_kind = KVS_LEND_REGION_CUDA,
                         .device = 7},
                 back;
    for (int k = 0; k < KVS_LEND_IPC_BYTES; k++) cuda.ipc[k] = (uint8_t)(0xff - 3 * k);
    for (int k = 0; k < KVS_LEND_UUID_BYTES; k++) cuda.uuid[k] = (uint8_t)(k * 17 + 1);
    uint8_t wire[KVS_LEND_WIRE_MAX];
    size_t n = kvs_lend_encode(&cuda, wire);
    ck_assert_uint_gt(n, KVS_LEND_IPC_BYTES + KVS_LEND_UUID_BYTES);
    char err[160];
    ck_assert_int_eq(kvs_lend_decode(wire, n, 0, &back, err, sizeof err), KVS_OK);
    ck_assert_mem_eq(&back, &cuda, sizeof cuda);
    for (size_t cut = 0; cut < n; cut++)
        ck_assert_int_eq(kvs_lend_decode(wire, cut, 0, &back, err, sizeof err), KVS_EINVAL);
    kvs_lend_msg bad = {.type = 0};
    uint8_t buf[KVS_LEND_WIRE_MAX];
    ck_assert_uint_eq(kvs_lend_encode(&bad, buf), 0);
    bad.type = KVS_LEND_BYE + 1;
    ck_assert_uint_eq(kvs_lend_encode(&bad, buf), 0);
}
END_TEST

static kvs_status decode_hex(const uint8_t *bytes, size_t n, uint32_t max_units, char *err) {
    kvs_lend_msg m;
    return kvs_lend_decode(bytes, n, max_units, &m, err, 160);
}

START_TEST(what_is_not_a_message_is_refused_with_a_sentence) {
    char err[160];
    /* [2, OFFER, 3, 9] is fine; then variations */
    const uint8_t ok[] = {0x94, 0x02, 0x02, 0x03, 0x09};
    ck_assert_int_eq(decode_hex(ok, sizeof ok, 4, err), KVS_OK);
    const uint8_t v1[] = {0x94, 0x01, 0x02, 0x03, 0x09}; /* a lender of before CUDA regions */
    ck_assert_int_eq(decode_hex(v1, sizeof v1, 4, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "version 1"));
    const uint8_t v3[] = {0x94, 0x03, 0x02, 0x03, 0x09};
    ck_assert_int_eq(decode_hex(v3, sizeof v3, 4, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "version 3"));
    const uint8_t type0[] = {0x94, 0x02, 0x00, 0x03, 0x09};
    ck_assert_int_eq(decode_hex(type0, sizeof type0, 4, err), KVS_EINVAL);
    const uint8_t type8[] = {0x94, 0x02, 0x08, 0x03, 0x09};
    ck_assert_int_eq(decode_hex(type8, sizeof type8, 4, err), KVS_EINVAL);
    const uint8_t far_unit[] = {0x94, 0x02, 0x02, 0x04, 0x09};
    ck_assert_int_eq(decode_hex(far_unit, sizeof far_unit, 4, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "unit 4 of 4"));
    ck_assert_int_eq(decode_hex(far_unit, sizeof far_unit, 0, err), KVS_OK); /* no bound given */
    const uint8_t trailing[] = {0x94, 0x02, 0x02, 0x03, 0x09, 0x00};
    ck_assert_int_eq(decode_hex(trailing, sizeof trailing, 4, err), KVS_EINVAL);
    const uint8_t short_hello[] = {0x94, 0x02, 0x01, 0x00, 0x00}; /* HELLO needs 10 fields */
    ck_assert_int_eq(decode_hex(short_hello, sizeof short_hello, 4, err), KVS_EINVAL);
    /* HELLO [2, 1, 0, 0, units, unit, region, kind, device, handle]: 4 units of 16 bytes in a
     * region of 63, of 0 units, of a size that overflows */
    const uint8_t small[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0x04,
                             0x10, 0x3f, 0x00, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(small, sizeof small, 0, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "cannot hold 4 units"));
    const uint8_t fits[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0x04, 0x10, 0x40, 0x00, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(fits, sizeof fits, 0, err), KVS_OK);
    const uint8_t none[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0x00, 0x10, 0x40, 0x00, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(none, sizeof none, 0, err), KVS_EINVAL);
    const uint8_t over[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0xce, 0xff, 0xff, 0xff, 0xff, 0xcf, 0x80,
                            0,    0,    0,    0,    0,    0,    0,    0x40, 0x00, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(over, sizeof over, 0, err), KVS_EINVAL);
    const uint8_t seven[] = {0x97, 0x02, 0x01, 0x00, 0x00, 0x04, 0x10, 0x40}; /* version 1's */
    ck_assert_int_eq(decode_hex(seven, sizeof seven, 0, err), KVS_EINVAL);
    /* the region's kind: 2 is none; a CUDA region without its handle, a host one with one */
    const uint8_t kind2[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0x04,
                             0x10, 0x40, 0x02, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(kind2, sizeof kind2, 0, err), KVS_EINVAL);
    const uint8_t bare[] = {0x9a, 0x02, 0x01, 0x00, 0x00, 0x04, 0x10, 0x40, 0x01, 0x00, 0xc4, 0x00};
    ck_assert_int_eq(decode_hex(bare, sizeof bare, 0, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "CUDA region with an IPC handle of 0 bytes, not 80"));
    enum { CUDA_BIN = KVS_LEND_IPC_BYTES + KVS_LEND_UUID_BYTES }; /* handle, then the GPU's UUID */
    uint8_t handled[12 + CUDA_BIN];
    memcpy(handled, fits, sizeof fits);
    handled[11] = CUDA_BIN;
    memset(handled + 12, 0x5a, KVS_LEND_IPC_BYTES);
    memset(handled + 12 + KVS_LEND_IPC_BYTES, 0x77, KVS_LEND_UUID_BYTES);
    ck_assert_int_eq(decode_hex(handled, sizeof handled, 0, err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "host region with an IPC handle of 80 bytes"));
    handled[8] = KVS_LEND_REGION_CUDA; /* the same bytes as a CUDA region: fine */
    kvs_lend_msg got;
    ck_assert_int_eq(kvs_lend_decode(handled, sizeof handled, 0, &got, err, sizeof err), KVS_OK);
    ck_assert(got.ipc[0] == 0x5a && got.ipc[63] == 0x5a && got.uuid[0] == 0x77 &&
              got.uuid[15] == 0x77);
    handled[11] = KVS_LEND_IPC_BYTES; /* a handle without its UUID (and bytes left over) */
    ck_assert_int_eq(decode_hex(handled, 12 + KVS_LEND_IPC_BYTES, 0, err), KVS_EINVAL);
    /* random bytes: refused or a well-formed message, never a crash (ASan checks) */
    uint64_t x = 88172645463325252ull;
    uint8_t junk[24];
    for (int i = 0; i < 200000; i++) {
        size_t n = 1 + i % sizeof junk;
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            junk[k] = (uint8_t)(k == 0 ? 0x94 + (x & 7) : x); /* 4 to 11 fields */
        }
        kvs_lend_msg m;
        if (kvs_lend_decode(junk, n, 16, &m, err, sizeof err) == KVS_OK)
            ck_assert(m.type >= KVS_LEND_HELLO && m.type <= KVS_LEND_BYE);
    }
}
END_TEST

START_TEST(a_hello_passes_a_region_both_sides_map) {
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    int region = memfd_create("kvs-lend-test", MFD_CLOEXEC);
    ck_assert_int_ge(region, 0);
    ck_assert_int_eq(ftruncate(region, 4 * 4096), 0);
    char err[160];
    kvs_lend_msg hello = {.type = KVS_LEND_HELLO,
                          .n_units = 4,
                          .unit_bytes = 4096,
                          .region_bytes = 4 * 4096},
                 m;
    ck_assert_int_eq(kvs_lend_send(sv[0], &hello, region, 1000, err, sizeof err), KVS_OK);
    int fd = -1;
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 0, &m, &fd, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m.type, KVS_LEND_HELLO);
    ck_assert_uint_eq(m.n_units, 4);
    ck_assert_int_ge(fd, 0);
    uint8_t *mine = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, region, 0);
    uint8_t *theirs = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(mine != MAP_FAILED && theirs != MAP_FAILED);
    memset(mine + 4096, 0xab, 4096); /* unit 1, written by the lender */
    ck_assert_uint_eq(theirs[4096 + 17], 0xab);
    /* an OFFER; a quiet channel times out; garbage is refused and the channel goes on */
    kvs_lend_msg offer = {.type = KVS_LEND_OFFER, .unit = 1, .epoch = 1};
    ck_assert_int_eq(kvs_lend_send(sv[0], &offer, -1, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    ck_assert(m.type == KVS_LEND_OFFER && m.unit == 1 && m.epoch == 1 && fd == -1);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 30, 4, &m, &fd, err, sizeof err), KVS_ETIMEDOUT);
    const uint8_t garbage[] = {0xc1, 0x00, 0x01};
    ck_assert_int_eq(send(sv[0], garbage, sizeof garbage, 0), (ssize_t)sizeof garbage);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EINVAL);
    uint8_t big[KVS_LEND_WIRE_MAX + 40];
    memset(big, 0x94, sizeof big);
    ck_assert_int_eq(send(sv[0], big, sizeof big, 0), (ssize_t)sizeof big);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "longer"));
    /* a HELLO without its descriptor, and an OFFER with one (closed, not leaked into fd) */
    ck_assert_int_eq(kvs_lend_send(sv[0], &hello, -1, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EINVAL);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(kvs_lend_send(sv[0], &offer, region, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    ck_assert_int_eq(fd, -1);
    /* a CUDA region's HELLO comes without a descriptor; one that brings one is refused (and the
     * descriptor closed) */
    kvs_lend_msg cuda = hello;
    cuda.region_kind = KVS_LEND_REGION_CUDA;
    memset(cuda.ipc, 0x33, sizeof cuda.ipc);
    ck_assert_int_eq(kvs_lend_send(sv[0], &cuda, -1, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    ck_assert(m.region_kind == KVS_LEND_REGION_CUDA && m.ipc[63] == 0x33 && fd == -1);
    int fds_before = open_fds();
    ck_assert_int_eq(kvs_lend_send(sv[0], &cuda, region, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "CUDA region's HELLO with 1 descriptors"));
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(open_fds(), fds_before);
    ck_assert_int_eq(kvs_lend_send(sv[0], &offer, -1, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    /* an empty packet with a descriptor from a live peer: refused, the descriptor closed, the
     * channel goes on */
    int before = open_fds();
    struct iovec none = {.iov_base = big, .iov_len = 0};
    union {
        char raw[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr mh = {.msg_iov = &none,
                        .msg_iovlen = 1,
                        .msg_control = ctl.raw,
                        .msg_controllen = sizeof ctl.raw};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &region, sizeof region);
    ck_assert_int_eq(sendmsg(sv[0], &mh, 0), 0);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    ck_assert_int_eq(open_fds(), before);
    /* a HELLO whose file is smaller than its region */
    kvs_lend_msg wide = hello;
    wide.region_bytes = 5 * 4096, wide.n_units = 5;
    ck_assert_int_eq(kvs_lend_send(sv[0], &wide, region, 1000, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 0, &m, &fd, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "in a file of 16384"));
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(open_fds(), before);
    /* a peer that reads nothing: the sender times out instead of blocking */
    kvs_status st = KVS_OK;
    int sent = 0;
    while ((st = kvs_lend_send(sv[0], &offer, -1, 20, err, sizeof err)) == KVS_OK) sent++;
    ck_assert_int_eq(st, KVS_ETIMEDOUT);
    ck_assert_int_gt(sent, 0);
    for (int k = 0; k < sent; k++)
        ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_send(sv[0], &offer, -1, 20, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_OK);
    /* the lender's end closes */
    close(sv[0]);
    ck_assert_int_eq(kvs_lend_recv(sv[1], 1000, 4, &m, &fd, err, sizeof err), KVS_EIO);
    ck_assert_ptr_nonnull(strstr(err, "lost"));
    ck_assert_int_eq(kvs_lend_send(sv[1], &offer, -1, 1000, err, sizeof err), KVS_EIO);
    munmap(mine, 4 * 4096), munmap(theirs, 4 * 4096);
    close(region), close(sv[1]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("lend_wire");
    TCase *tc = tcase_create("lend_wire");
    tcase_add_test(tc, every_message_round_trips);
    tcase_add_test(tc, what_is_not_a_message_is_refused_with_a_sentence);
    tcase_add_test(tc, a_hello_passes_a_region_both_sides_map);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
