/* kvstrata_cmd.h - the subcommands of the operator's `kvstrata` command. Each takes the arguments
 * after its name (argv[0] is the subcommand) and returns the process exit status: 0 done, 1 the
 * work found a problem (a damaged object, an invalid file), 2 a usage error. Each answers --help. */
#ifndef KVS_KVSTRATA_CMD_H
#define KVS_KVSTRATA_CMD_H

int kvs_cmd_check(int argc, char **argv);
int kvs_cmd_stats(int argc, char **argv);
int kvs_cmd_inspect(int argc, char **argv);
int kvs_cmd_compare(int argc, char **argv);

/* The directory of the running program (build/bin, or <prefix>/bin), for its sibling programs. */
const char *kvs_cmd_exe_dir(void);

#endif
