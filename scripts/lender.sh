# lender.sh - sourced by the scripts that run the mini engine over a peer_gpu tier (tests/e2e,
# bench): a config with that tier over DRAM, and a kvstrata-lend started in the background.
# The sourcing script sets $work and defines fail().

# lender_config DRAM_CAPACITY [EXTRA_PEER_OPTION_LINES]: $work/config.yaml, a peer_gpu tier on
# $work/lend.sock over a dram tier
lender_config() {
    cat >"$work/config.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: warn
tiers:
  - name: peer
    type: peer_gpu
    options:
      socket: lend.sock     # relative to this file
${2:-}
  - name: dram
    type: dram
    capacity: $1
YAML
}

# lender_start LEND UNITS UNIT_SIZE [STDIN]: kvstrata-lend on $work/lend.sock, its output in
# $work/lend.out and its pid in $lender_pid, once it is ready (STDIN: what it reads; /dev/null)
lender_start() {
    # KVS_LEND_DEVICE=cuda:N: the region in that GPU's memory, lent over CUDA IPC
    "$1" --socket "$work/lend.sock" --units "$2" --unit-size "$3" \
        --device "${KVS_LEND_DEVICE:-host}" <"${4:-/dev/null}" >"$work/lend.out" 2>&1 &
    lender_pid=$!
    _i=0
    until grep -q '^ready ' "$work/lend.out" 2>/dev/null; do
        _i=$((_i + 1))
        [ $_i -le 300 ] || fail "the lender printed no readiness line in 30 s"
        sleep 0.1
    done
}
