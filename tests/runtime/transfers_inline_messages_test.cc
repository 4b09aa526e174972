// transfers_test with shared memory and data frames turned off (GMUX_SHM=0,
// GMUX_DATA_FRAMES=0): large transfers inline as BulkData and ReadData messages, as with a
// peer that does not know data frames.
// variant of: transfers_test
