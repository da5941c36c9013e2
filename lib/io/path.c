/* Input and output files checked before use (lib/io/path.h says why). */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distlab/error.h"
#include "io/path.h"

static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISLNK(m))
        return "a symbolic link";
    return "not a regular file";
}

static int not_regular(const char *what, const char *path, mode_t m)
{
    return dl_error(DL_EINVAL, "%s '%s' is %s; only regular files are read", what, path,
                    kind_of(m));
}

int dl_path_open_input(const char *path, const char *what, int *fd)
{
    if (!fd)
        return dl_error(DL_EINVAL, "%s: null file descriptor pointer", what);
    *fd = -1;
    if (!path || !*path)
        return dl_error(DL_EINVAL, "%s: empty file name", what);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dl_error(errno == ENOENT || errno == ENOTDIR ? DL_EINVAL : DL_ESYS,
                        "cannot open %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return not_regular(what, path, sb.st_mode);
    /* O_NONBLOCK: should the name have become a FIFO since the stat, open() still returns */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0)
        return dl_error(errno == ENOENT ? DL_EINVAL : DL_ESYS, "cannot open %s '%s': %s", what,
                        path, strerror(errno));
    if (fstat(f, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        int st = S_ISREG(sb.st_mode)
                     ? dl_error(DL_ESYS, "%s '%s': fstat: %s", what, path, strerror(e))
                     : not_regular(what, path, sb.st_mode);
        close(f);
        return st;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0)
        fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    return DL_OK;
}

/* The directory part of path in buf ("." when there is none). */
static void dir_of(const char *path, char *buf, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(buf, n, ".");
        return;
    }
    size_t len = (size_t)(slash - path);
    if (len == 0)
        len = 1; /* "/x": the root */
    if (len >= n)
        len = n - 1;
    memcpy(buf, path, len);
    buf[len] = '\0';
}

int dl_path_check_output(const char *path, const char *what)
{
    if (!path || !*path)
        return dl_error(DL_EINVAL, "%s: empty file name", what);
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (S_ISLNK(sb.st_mode))
            return dl_error(DL_EINVAL,
                            "%s: '%s' is a symbolic link; refusing to replace it (give the "
                            "target's path)",
                            what, path);
        if (!S_ISREG(sb.st_mode))
            return dl_error(DL_EINVAL, "%s: '%s' is %s; refusing to replace it", what, path,
                            kind_of(sb.st_mode));
        if (access(path, W_OK) != 0)
            return dl_error(DL_ESYS, "%s: cannot write '%s': %s", what, path, strerror(errno));
    } else if (errno != ENOENT) {
        return dl_error(DL_ESYS, "%s: cannot write '%s': %s", what, path, strerror(errno));
    }
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0)
        return dl_error(DL_ESYS, "%s: cannot write '%s': directory '%s': %s", what, path, dir,
                        strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dl_error(DL_ESYS, "%s: cannot write '%s': '%s' is not a directory", what, path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return dl_error(DL_ESYS, "%s: cannot write '%s': directory '%s': %s", what, path, dir,
                        strerror(errno));
    return DL_OK;
}

/* The PID of a "BASE.tmp.PID" name, or 0 when `name` is not one. */
static long tmp_pid(const char *name, const char *base, size_t blen)
{
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0)
        return 0;
    const char *d = name + blen + 5;
    char *end;
    long pid = strtol(d, &end, 10);
    return *d >= '1' && *d <= '9' && *end == '\0' && pid > 0 ? pid : 0;
}

int dl_path_remove_stale_tmp(const char *path)
{
    if (!path || !*path)
        return 0;
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = tmp_pid(e->d_name, base, blen);
        if (pid == 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(full) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
