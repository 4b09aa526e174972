// map_shm_test with buffers on shared memory turned off (GMUX_BUFFER_STORAGE=0): every mapping
// is a copy, through pooled shared memory or the stream.
// variant of: map_shm_test
