// Package scalebench measures the exporter at the size of a large
// organization: the real exporter binary (built from this tree) polls the
// platform simulator's organization of 1,000 (and 200) environments in 10
// properties and writes to a real ClickHouse, and the benchmark records the
// data requests of each poll cycle as the simulator received them (retries
// included), poll duration, series, scrape time and bytes, the exporter's
// resident memory and ClickHouse rows per cycle, for the default selection
// and for the lean example config (examples/lean.yaml).
//
// The code lives in the package's tests: BenchmarkScale is `make
// bench-scale` (about a quarter of an hour); TestScaleSmoke runs the same
// measurement on 60 environments in `make test`.
package scalebench
