package inventory

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of the inventory, the kind label of its self-metrics.
const (
	KindEnvironments    = "environments"
	KindTLSCertificates = "tls_certificates"
)

// descs are the inventory's metric descriptions, made once.
type descs struct {
	envInfo, certExpiry, certInfo, certFailed *prometheus.Desc
	up, lastSuccess                           *prometheus.Desc
}

func newDescs(prefix string) descs {
	return descs{
		envInfo: prometheus.NewDesc(prefix+"_environment_info",
			"1 per environment served: its name, its property's slug and organization (join on environment_id for names; an environment the platform could not name shows its ID as name).",
			[]string{"environment_id", "environment", "property_id", "property", "organization_id"}, nil),
		certExpiry: prometheus.NewDesc(prefix+"_tls_certificate_expiry_timestamp_seconds",
			"When the TLS certificate expires (its expiration, Unix seconds), as the config API listed it last.",
			[]string{"environment_id", "certificate_id", "common_name"}, nil),
		certInfo: prometheus.NewDesc(prefix+"_tls_certificate_info",
			"1 per TLS certificate of an environment served: common name, serial, status and whether the platform generated it.",
			[]string{"environment_id", "certificate_id", "common_name", "serial", "status", "generated"}, nil),
		certFailed: prometheus.NewDesc(prefix+"_tls_certificate_activation_failed",
			"1 when the platform could not activate the TLS certificate (its activation_error is set), else 0.",
			[]string{"environment_id", "certificate_id"}, nil),
		up: prometheus.NewDesc("edgepipe_inventory_up",
			"1 when the last refresh of the inventory's kind succeeded for every environment served: environments, every one named; tls_certificates, every one's certificates listed (0 until the first pass ends, and while the platform refuses the config scope).",
			[]string{"kind"}, nil),
		lastSuccess: prometheus.NewDesc("edgepipe_inventory_last_success_timestamp_seconds",
			"When the last pass that listed the TLS certificates of every environment served ended (Unix seconds).",
			[]string{"kind"}, nil),
	}
}

// Describe sends the descriptions of every metric the inventory exports.
func (inv *Inventory) Describe(ch chan<- *prometheus.Desc) {
	d := inv.descs
	for _, x := range []*prometheus.Desc{d.envInfo, d.certExpiry, d.certInfo, d.certFailed, d.up, d.lastSuccess} {
		ch <- x
	}
}

// Collect builds the inventory's metrics from what it holds now.
func (inv *Inventory) Collect(ch chan<- prometheus.Metric) {
	d := inv.descs
	inv.mu.Lock()
	defer inv.mu.Unlock()
	n, c := &inv.names, &inv.certs
	for _, id := range n.served {
		e, ok := n.byID[id]
		if !ok {
			e = Environment{ID: id, Name: id}
		}
		ch <- constMetric(d.envInfo, 1, id, e.Name, e.PropertyID, e.Property, e.OrganizationID)
		for _, cert := range c.byEnv[id] {
			if !cert.Expiration.IsZero() {
				ch <- constMetric(d.certExpiry, float64(cert.Expiration.Unix()), id, cert.ID, cert.CommonName)
			}
			ch <- constMetric(d.certInfo, 1, id, cert.ID, cert.CommonName, cert.Serial, cert.Status, strconv.FormatBool(cert.Generated))
			failed := 0.0
			if cert.ActivationError != "" {
				failed = 1
			}
			ch <- constMetric(d.certFailed, failed, id, cert.ID)
		}
	}
	ch <- prometheus.MustNewConstMetric(d.up, prometheus.GaugeValue, boolValue(n.complete()), KindEnvironments)
	if !c.enabled {
		return
	}
	ch <- prometheus.MustNewConstMetric(d.up, prometheus.GaugeValue, boolValue(c.passes > 0 && c.lastPassOK && !c.refused), KindTLSCertificates)
	if !c.lastSuccess.IsZero() {
		ch <- prometheus.MustNewConstMetric(d.lastSuccess, prometheus.GaugeValue, float64(c.lastSuccess.UnixNano())/1e9, KindTLSCertificates)
	}
}

// constMetric is a gauge of desc with the platform's strings as label
// values, made valid UTF-8 (a label value that is not would fail the
// whole scrape).
func constMetric(desc *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	for i, l := range labels {
		labels[i] = strings.ToValidUTF8(l, "\uFFFD")
	}
	m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
