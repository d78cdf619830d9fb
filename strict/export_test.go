package strict

// SharedURL is the URL of the test binary's redis-server, for the examples (package
// strict_test).
func SharedURL() string { return shared.URL() }
