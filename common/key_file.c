#include "key_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static kvs_status read_all(int fd, const char *what, const char *path, uint8_t *out, size_t want,
                           char *error, size_t error_len) {
    size_t got = 0;
    while (got < want) {
        ssize_t n = read(fd, out + got, want - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            kvs_fmt(error, error_len, "%s: key file %s could not be read whole (%s)", what, path,
                    n < 0 ? strerror(errno) : "it shrank");
            return KVS_EIO;
        }
        got += (size_t)n;
    }
    return KVS_OK;
}

static kvs_status check_file(int fd, const char *what, const char *path, size_t cap, size_t min,
                             size_t *size, char *error, size_t error_len) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        kvs_fmt(error, error_len, "%s: key file %s cannot be examined (%s)", what, path,
                strerror(errno));
        return KVS_EIO;
    }
    if (!S_ISREG(sb.st_mode)) {
        kvs_fmt(error, error_len, "%s: key file %s is not a regular file", what, path);
        return KVS_EINVAL;
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        kvs_fmt(error, error_len,
                "%s: key file %s has mode %04o; it must not be open to group or others (chmod 600)",
                what, path, (unsigned)(sb.st_mode & 07777));
        return KVS_EINVAL;
    }
    if (sb.st_size < (off_t)min || sb.st_size > (off_t)cap) {
        kvs_fmt(error, error_len, "%s: key file %s holds %lld bytes; a key is %zu..%zu bytes", what,
                path, (long long)sb.st_size, min, cap);
        return KVS_EINVAL;
    }
    *size = (size_t)sb.st_size;
    return KVS_OK;
}

kvs_status kvs_key_file_load(const char *what, const char *path, uint8_t *out, size_t cap,
                             size_t min, size_t *len, char *error, size_t error_len) {
    if (!what || !path || !out || !len) return KVS_EINVAL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        kvs_fmt(error, error_len, "%s: key file %s cannot be opened (%s)", what, path,
                strerror(errno));
        return KVS_EIO;
    }
    size_t size = 0;
    kvs_status st = check_file(fd, what, path, cap, min, &size, error, error_len);
    if (st == KVS_OK) st = read_all(fd, what, path, out, size, error, error_len);
    close(fd);
    if (st == KVS_OK)
        *len = size;
    else
        explicit_bzero(out, cap);
    return st;
}
