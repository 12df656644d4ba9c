// Package deploytest checks the deployment artefacts that are not Go code:
// the Helm chart in deploy/helm/edgepipe (linted and rendered with a real
// helm binary, the rendered objects asserted), the Grafana dashboards in
// dashboards/ (every query target extracted, its variables and macros
// substituted, and run against a real Prometheus and ClickHouse), the
// Dockerfile (built the same way as `make build`, and describing the same
// image as `make image`), the container image (`make image` run, and the
// image run in podman as the chart runs it), the version stamp, and
// `make demo` (run, and its Prometheus checked through its API).
//
// The non-test code of the package is the dashboard model: reading the JSON
// files, listing their query targets, and expanding Grafana's variables and
// the ClickHouse plugin's macros into queries a server can run.
package deploytest
