/* A shared object that is not a kvstrata backend (no kvs_backend_entry). */
int plugin_not_backend_marker(void);
int plugin_not_backend_marker(void) {
    return 42;
}
