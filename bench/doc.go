// Package bench compares Sluice with the libraries users would pick instead, in the same
// run, as ratios. It is its own module so that the libraries compared against are not
// dependencies of Sluice. Run it with `make bench` from the project's root; results go in
// BENCHMARKS.md.
//
// Every benchmark has sub-benchmarks named impl=NAME, run interleaved (one of each, then
// again, -count times), and `benchstat -col /impl` turns them into ratios.
package bench
