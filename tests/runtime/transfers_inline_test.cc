// transfers_test with shared memory turned off (GMUX_SHM=0): large transfers inline.
// variant of: transfers_test
