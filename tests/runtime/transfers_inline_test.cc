// transfers_test with shared memory turned off (GMUX_SHM=0): large transfers inline.
#include "runtime/transfers_test.cc"
