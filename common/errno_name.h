/* errno_name.h - the symbolic name of an errno value ("EACCES"), the spelling error sentences use
 * (CONVENTIONS.md: `... is not writable (EACCES)`). Thread-safe; the names are static. */
#ifndef KVS_ERRNO_NAME_H
#define KVS_ERRNO_NAME_H

/* "EACCES" for EACCES; "unknown error" for a value with no name. Never NULL. */
const char *kvs_errno_name(int err);

#endif /* KVS_ERRNO_NAME_H */
