// transfers_test over TCP: every transfer inline in the stream.
// variant of: transfers_test
