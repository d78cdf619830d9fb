package redis

// SharedURL is the URL of the test binary's redis-server, for the examples (package
// redis_test).
func SharedURL() string { return shared.URL() }
