package deploytest

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

// TestChartKafkaSecurity checks the receiver's Kafka TLS and SASL settings:
// flags for the mounted TLS files and the mechanism, SASL credentials only
// through secretKeyRef (optional, like the ClickHouse password), and the
// credential literals nowhere but in the chart's Secret.
func TestChartKafkaSecurity(t *testing.T) {
	t.Run("production values", func(t *testing.T) {
		m := render(t, chartDir+"/ci/production-values.yaml")
		c := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
		if !c.hasArg("--kafka.tls") {
			t.Errorf("no --kafka.tls in %v", c.Args)
		}
		if v, _ := c.argValue("--kafka.sasl.mechanism"); v != "scram-sha-512" {
			t.Errorf("--kafka.sasl.mechanism = %q, want scram-sha-512", v)
		}
		for _, flag := range []string{"--kafka.tls.ca-file", "--kafka.tls.cert-file", "--kafka.tls.key-file"} {
			v, ok := c.argValue(flag)
			if !ok || !mounted(c, filepath.Dir(v)) {
				t.Errorf("%s = %q is not on a mounted volume", flag, v)
			}
		}
		if c.hasArg("--kafka.tls.insecure-skip-verify") {
			t.Error("--kafka.tls.insecure-skip-verify rendered without being asked for")
		}
		for _, name := range []string{"EDGEPIPE_KAFKA_USERNAME", "EDGEPIPE_KAFKA_PASSWORD"} {
			ev := c.env(name)
			if ev == nil || ev.Value != nil || ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil ||
				ev.ValueFrom.SecretKeyRef.Name != "edgepipe-credentials" || ev.ValueFrom.SecretKeyRef.Key != name ||
				!ev.ValueFrom.SecretKeyRef.Optional {
				t.Errorf("%s is not an optional secretKeyRef to edgepipe-credentials/%s: %+v", name, name, ev)
			}
		}
	})

	t.Run("defaults", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("receiver:\n  kafka:\n    brokers: kafka:9092\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		m := render(t, values)
		c := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
		if c.hasArg("--kafka.tls") || mounted(c, "/etc/edgepipe/kafka-tls") {
			t.Errorf("TLS rendered by default: %v", c.Args)
		}
		if v, _ := c.argValue("--kafka.sasl.mechanism"); v != "none" {
			t.Errorf("--kafka.sasl.mechanism = %q, want none", v)
		}
		if c.env("EDGEPIPE_KAFKA_PASSWORD") != nil {
			t.Error("EDGEPIPE_KAFKA_PASSWORD rendered without SASL")
		}
	})

	t.Run("chart-created Secret", func(t *testing.T) {
		const user, pass = "ci-kafka-user-value", "ci-kafka-password-value"
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte(`receiver:
  kafka:
    brokers: kafka:9093
    tls:
      enabled: true
      insecureSkipVerify: true
    sasl:
      mechanism: plain
credentials:
  kafkaUsername: `+user+`
  kafkaPassword: `+pass+`
`), 0o600); err != nil {
			t.Fatal(err)
		}
		m := render(t, values)
		var sec struct {
			Data map[string]string `yaml:"data"`
		}
		m.get(t, "Secret", "ci-edgepipe").decode(t, &sec)
		for key, want := range map[string]string{"EDGEPIPE_KAFKA_USERNAME": user, "EDGEPIPE_KAFKA_PASSWORD": pass} {
			if got, err := base64.StdEncoding.DecodeString(sec.Data[key]); err != nil || string(got) != want {
				t.Errorf("Secret key %s = %q (%v), want %q", key, got, err, want)
			}
		}
		for _, o := range m {
			if o.Kind == "Secret" {
				continue
			}
			for _, v := range []string{user, pass} {
				for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
					if strings.Contains(o.text, form) {
						t.Errorf("%s %s contains a Kafka credential (%q)", o.Kind, o.Metadata.Name, form)
					}
				}
			}
		}
		c := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
		if !c.hasArg("--kafka.tls") || !c.hasArg("--kafka.tls.insecure-skip-verify") || c.hasArg("--kafka.tls.ca-file") {
			t.Errorf("TLS without a Secret: args %v", c.Args)
		}
	})

	t.Run("rejected", func(t *testing.T) {
		for _, tc := range []struct {
			set  []string
			want string
		}{
			{[]string{"receiver.kafka.brokers=k:9092", "receiver.kafka.sasl.mechanism=scram-sha-256"}, "credentials.kafkaUsername"},
			{[]string{"receiver.kafka.sasl.mechanism=gssapi"}, "mechanism"},
			{[]string{"receiver.kafka.tls.enable=true"}, "enable"},
		} {
			args := []string{"template", releaseName, chartDir, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			if _, err := helm(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: err %v, want one mentioning %q", tc.set, err, tc.want)
			}
		}
	})
}

// TestChartKafkaWriteTimeout checks receiver.kafka.writeTimeout: by default
// the receiver's own default, a value set passed on as --kafka.write-timeout
// (TestChartRejectsBadValues has one that is not a duration).
func TestChartKafkaWriteTimeout(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"default", "receiver:\n  kafka:\n    brokers: kafka:9092\n", kafkasink.DefaultWriteTimeout.String()},
		{"set", "receiver:\n  kafka:\n    brokers: kafka:9092\n    writeTimeout: 1m30s\n", "1m30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(tc.values), 0o600); err != nil {
				t.Fatal(err)
			}
			c := workloadOf(t, render(t, values), "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
			if v, ok := c.argValue("--kafka.write-timeout"); !ok || v != tc.want {
				t.Errorf("--kafka.write-timeout = %q (rendered: %v), want %q", v, ok, tc.want)
			}
		})
	}
}
