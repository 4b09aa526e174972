// transfers_test over TCP: every transfer inline in the stream.
#include "runtime/transfers_test.cc"
