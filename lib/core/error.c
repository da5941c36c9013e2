/* Error codes and the per-thread error message. */
#include "config.h"
#include <stdarg.h>
#include <stdio.h>
#include "distlab.h"

static _Thread_local char errbuf[1024];

const char *dl_strstatus(int status)
{
    switch (status) {
    case DL_OK: return "DL_OK";
    case DL_EINVAL: return "DL_EINVAL";
    case DL_ENOMEM: return "DL_ENOMEM";
    case DL_EABORT: return "DL_EABORT";
    case DL_ETIMEOUT: return "DL_ETIMEOUT";
    case DL_EMISMATCH: return "DL_EMISMATCH";
    case DL_ESYS: return "DL_ESYS";
    case DL_EUSER: return "DL_EUSER";
    default: return "DL_E?";
    }
}

const char *dl_errmsg(void) { return errbuf; }

void dl_error_clear(void) { errbuf[0] = '\0'; }

int dl_error(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return status;
}

const char *dl_version(void) { return PACKAGE_VERSION; }
