// transfers_test with buffers on shared memory turned off (GMUX_BUFFER_STORAGE=0): blocking
// transfers take the copying paths (remote copy, shared memory, the stream), as on a device that
// does not work on host memory in place (a discrete GPU).
// variant of: transfers_test
