// transfers_test with remote copy turned off (GMUX_REMOTE_COPY=0): large transfers through
// shared memory, as for a client its worker may not read (another uid, not dumpable).
// variant of: transfers_test
