// programs_test over TCP (GMUX_ADDRESS and a token instead of the Unix socket).
// variant of: programs_test
