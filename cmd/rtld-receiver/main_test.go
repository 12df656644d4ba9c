package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestParseFlagsDefaultsAndLists(t *testing.T) {
	t.Setenv("EDGEPIPE_ENVIRONMENT_ID", "")
	f, err := parseFlags([]string{"--environment-id=a,b", "--environment-id=c", "--kafka.brokers=k1:9092, k2:9092"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.platform.EnvironmentIDs, []string{"a", "b", "c"}) {
		t.Fatalf("environments %q", f.platform.EnvironmentIDs)
	}
	if got := cli.SplitList(f.kafkaBrokers); !reflect.DeepEqual(got, []string{"k1:9092", "k2:9092"}) {
		t.Fatalf("brokers %q", got)
	}
	if f.kafkaTopic != "cdn-access-logs" || f.spoolDir != "./data/spool" || f.profileName != "edgepipe" || !f.register ||
		len(*f.web.Flags.WebListenAddresses) != 1 || (*f.web.Flags.WebListenAddresses)[0] != ":9781" {
		t.Fatalf("defaults: %+v", f)
	}
	if f.spoolMaxBytes != 10<<30 || f.maxDecodedBytes != 32<<20 {
		t.Fatalf("sizes: %d %d", f.spoolMaxBytes, f.maxDecodedBytes)
	}
	t.Setenv("EDGEPIPE_ENVIRONMENT_ID", "x,y")
	if f, err = parseFlags(nil); err != nil || !reflect.DeepEqual(f.platform.EnvironmentIDs, []string{"x", "y"}) {
		t.Fatalf("from the environment: %q %v", f.platform.EnvironmentIDs, err)
	}
	// --auth.url defaults to --api.url, as on the exporter.
	if f, err = parseFlags([]string{"--api.url=https://api.example"}); err != nil || f.platform.AuthURL != "https://api.example" {
		t.Fatalf("--auth.url default: %q %v", f.platform.AuthURL, err)
	}
}

func TestKafkaSecurityFlags(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	// The SASL secret has no flag: any spelling of one is rejected.
	for _, arg := range []string{"--kafka.password=x", "--kafka.sasl.password=x", "--kafka.sasl.username=u", "--kafka.username=u"} {
		if _, err := parseFlags([]string{arg}); err == nil {
			t.Errorf("%s: accepted; Kafka credentials must come only from the environment", arg)
		}
	}
	if _, err := parseFlags([]string{"--kafka.sasl.mechanism=gssapi"}); err == nil {
		t.Error("--kafka.sasl.mechanism=gssapi: accepted")
	}
	f, err := parseFlags([]string{"--kafka.brokers=k:9093"})
	if err != nil {
		t.Fatal(err)
	}
	if f.kafkaSASLMechanism != "none" || f.kafkaTLS {
		t.Fatalf("defaults: sasl %q tls %v", f.kafkaSASLMechanism, f.kafkaTLS)
	}
	if c, err := kafkaConfig(f, "", "", log); err != nil || c.SASL != nil || c.TLS != nil {
		t.Fatalf("plaintext config: %+v %v", c, err)
	}

	// Credentials from the environment and a _FILE, read through the same
	// table as the receiver's other secrets.
	t.Setenv("EDGEPIPE_KAFKA_USERNAME", "edgepipe")
	pw := filepath.Join(t.TempDir(), "kafka-pw")
	if err := os.WriteFile(pw, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("EDGEPIPE_KAFKA_PASSWORD_FILE", pw)
	f, err = parseFlags([]string{"--kafka.brokers=k:9093"})
	if err != nil {
		t.Fatal(err)
	}
	user, _ := f.kafkaUsername.Read()
	pass, err := f.kafkaPassword.Read()
	if err != nil || user != "edgepipe" || pass != "file-secret" {
		t.Fatalf("secrets: %q %q %v", user, pass, err)
	}

	for _, tc := range []struct {
		name       string
		args       []string
		user, pass string
		wantSASL   string
		wantTLS    bool
		wantErr    string
	}{
		{name: "scram-sha-512", args: []string{"--kafka.sasl.mechanism=scram-sha-512"}, user: user, pass: pass, wantSASL: "SCRAM-SHA-512"},
		{name: "plain over tls", args: []string{"--kafka.sasl.mechanism=plain", "--kafka.tls"}, user: user, pass: pass, wantSASL: "PLAIN", wantTLS: true},
		{name: "insecure tls", args: []string{"--kafka.tls", "--kafka.tls.insecure-skip-verify"}, wantTLS: true},
		{name: "mechanism without password", args: []string{"--kafka.sasl.mechanism=scram-sha-256"}, user: user, wantErr: "EDGEPIPE_KAFKA_PASSWORD"},
		{name: "ca file without --kafka.tls", args: []string{"--kafka.tls.ca-file=/etc/ssl/ca.pem"}, wantErr: "need --kafka.tls"},
		{name: "missing ca file", args: []string{"--kafka.tls", "--kafka.tls.ca-file=" + filepath.Join(t.TempDir(), "none.pem")}, wantErr: "CA file"},
		{name: "cert without key", args: []string{"--kafka.tls", "--kafka.tls.cert-file=" + pw}, wantErr: "key file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFlags(append([]string{"--kafka.brokers=k:9093"}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			c, err := kafkaConfig(f, tc.user, tc.pass, log)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if tc.pass != "" && strings.Contains(err.Error(), tc.pass) {
					t.Fatalf("error leaks the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if c.SASL != nil {
				got = c.SASL.Name()
			}
			if got != tc.wantSASL || (c.TLS != nil) != tc.wantTLS {
				t.Fatalf("SASL %q TLS %v, want %q %v", got, c.TLS != nil, tc.wantSASL, tc.wantTLS)
			}
		})
	}
	if !strings.Contains(logged.String(), "insecure-skip-verify") {
		t.Errorf("no warning about --kafka.tls.insecure-skip-verify in the log:\n%s", logged.String())
	}
	if strings.Contains(logged.String(), pass) {
		t.Errorf("the log holds the Kafka password:\n%s", logged.String())
	}
}

func TestClickHouseFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantErr   string
		retention time.Duration
	}{
		{args: nil},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.retention=30d"}, retention: 30 * 24 * time.Hour},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.cluster=c", "--clickhouse.insert-quorum=2"}},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.insert-quorum=2"}, wantErr: "only with --clickhouse.cluster"},
		{args: []string{"--clickhouse.dsn=clickhouse://h:9000/cdn", "--clickhouse.retention=-1h"}, wantErr: "not a valid duration"},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn"}},
		{args: []string{"--clickhouse.dsn=https://h:8443/cdn?secure=true", "--clickhouse.tls.ca-file=main_test.go"}, wantErr: "no PEM certificate"},
		{args: []string{"--clickhouse.dsn=https://h:8443/cdn?secure=true", "--clickhouse.tls.server-name=ch", "--clickhouse.tls.insecure-skip-verify"}},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn", "--clickhouse.tls.insecure-skip-verify"}, wantErr: "TLS options need a DSN with TLS"},
		{args: []string{"--clickhouse.dsn=http://h:8123/cdn", "--clickhouse.cluster=c"}, wantErr: "needs the native protocol"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			f, err := parseFlags(tc.args)
			if err != nil {
				if tc.wantErr != "" && strings.Contains(err.Error(), tc.wantErr) {
					return
				}
				t.Fatal(err)
			}
			c, err := clickhouseConfig(f, "")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c == nil) != (f.clickhouseDSN == "") {
				t.Fatalf("config %+v for DSN %q", c, f.clickhouseDSN)
			}
			if c != nil && c.Retention != tc.retention {
				t.Errorf("retention %v, want %v", c.Retention, tc.retention)
			}
		})
	}
}

func TestRecordLimitMustFitKafka(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--kafka.brokers=k:9092"}, true}, // 512KiB ≤ 1MiB
		{[]string{"--kafka.brokers=k:9092", "--ingest.max-record-bytes=4MiB"}, false},
		{[]string{"--kafka.brokers=k:9092", "--ingest.max-record-bytes=4MiB", "--kafka.max-message-bytes=10MiB"}, true},
		{[]string{"--kafka.brokers=k:9092", "--ingest.max-record-bytes=1MiB", "--kafka.max-message-bytes=1MiB"}, true},
		{[]string{"--ingest.max-record-bytes=4MiB"}, true}, // no Kafka
	} {
		f, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		err = checkRecordLimit(f)
		if (err == nil) != tc.ok {
			t.Errorf("%v: %v", tc.args, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "--ingest.max-record-bytes") || !strings.Contains(err.Error(), "--kafka.max-message-bytes")) {
			t.Errorf("error does not name both flags: %v", err)
		}
	}
}

func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		command string
		sink    string
	}{
		{nil, cmdRun, ""},
		{[]string{"--spool.dir=/x"}, cmdRun, ""},
		{[]string{"run", "--spool.dir=/x"}, cmdRun, ""},
		{[]string{"dead-letter", "list", "--spool.dir=/x"}, cmdDeadLetterList, ""},
		{[]string{"dead-letter", "replay", "--sink", "kafka", "--kafka.brokers=k:9092"}, cmdDeadLetterReplay, "kafka"},
	} {
		f, err := parseFlags(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if f.command != tc.command || f.deadLetterSink != tc.sink {
			t.Errorf("%v: command %q sink %q", tc.args, f.command, f.deadLetterSink)
		}
	}
	if _, err := parseFlags([]string{"dead-letter", "replay", "--sink", "s3"}); err == nil {
		t.Error("--sink s3 accepted")
	}
	f, _ := parseFlags(nil)
	if f.kafkaMaxMessageBytes != 1<<20 || f.deadLetterMaxBytes != 1<<30 {
		t.Errorf("defaults: --kafka.max-message-bytes %d, --dead-letter.max-bytes %d", f.kafkaMaxMessageBytes, f.deadLetterMaxBytes)
	}
}

// TestHTTPDSNTo1816StopsAtStart: an HTTP DSN to ClickHouse 18.16, whose
// HTTP interface clickhouse-go cannot talk to, stops the receiver at
// start with an error naming the server's version and the native
// protocol, instead of spooling batches it could never deliver.
func TestHTTPDSNTo1816StopsAtStart(t *testing.T) {
	ch := testenv.ClickHouse(t)
	t.Setenv("EDGEPIPE_CLICKHOUSE_DSN", "")
	t.Setenv("EDGEPIPE_RTLD_USERNAME", "platform")
	t.Setenv("EDGEPIPE_RTLD_PASSWORD", "correct horse")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := run(ctx, []string{"--no-register", "--web.listen-address=" + testenv.FreeAddr(t), "--spool.dir=" + t.TempDir(),
		"--clickhouse.dsn=http://" + ch.HTTPAddr() + "/cdn", "--log.level=warn"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ClickHouse 18.16.1") || !strings.Contains(err.Error(), "clickhouse://") {
		t.Errorf("%v, want an error naming ClickHouse 18.16.1 and the native protocol", err)
	}
}

func TestLogMetricsFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		off     bool
		labels  string
		maxS    int
		wantErr []string
	}{
		{args: nil, labels: "[pop]", maxS: logmetrics.DefaultMaxSeries},
		{args: []string{"--no-log-metrics.enabled"}, off: true},
		{args: []string{"--log-metrics.labels="}, labels: "[]", maxS: logmetrics.DefaultMaxSeries},
		{args: []string{"--log-metrics.labels=pop, host,client_country_code", "--log-metrics.max-series=0"}, labels: "[pop host client_country_code]"},
		{args: []string{"--log-metrics.top-n=0", "--log-metrics.top-n-window=0s", "--log-metrics.max-series=-1", "--log-metrics.series-ttl=-1h"},
			wantErr: []string{"--log-metrics.top-n must be at least 1", "--log-metrics.top-n-window must be positive", "--log-metrics.max-series must not be negative", "--log-metrics.series-ttl must be positive"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			f, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.logMetrics.config()
			if tc.wantErr != nil {
				testenv.CheckErr(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c == nil) != tc.off {
				t.Fatalf("config %+v, want off: %v", c, tc.off)
			}
			if c == nil {
				return
			}
			if fmt.Sprint(c.Labels) != tc.labels || c.Labels == nil || c.MaxSeries != tc.maxS ||
				c.TopN != logmetrics.DefaultTopN || c.TopNWindow != logmetrics.DefaultTopNWindow || c.SeriesTTL != logmetrics.DefaultSeriesTTL {
				t.Errorf("config %+v, want labels %s, max series %d and the defaults", c, tc.labels, tc.maxS)
			}
		})
	}
}
