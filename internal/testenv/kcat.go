package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"
)

// Kcat returns the path of kcat (librdkafka's command-line client; older
// Debian releases call it kafkacat). Missing: skip, or fail with CI=true.
func Kcat(t testing.TB) string {
	t.Helper()
	if p, err := lookBinary("kcat"); err == nil {
		return p
	}
	if p, err := lookBinary("kafkacat"); err == nil {
		return p
	}
	missing(t, "kcat not found on PATH or in /usr/bin: run `make deps` to install it")
	return ""
}

// KcatMessage is one message as kcat's JSON envelope (-J) shows it.
type KcatMessage struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Timestamp is the message timestamp in milliseconds since the epoch.
	Timestamp int64 `json:"ts"`
	// Key and Payload are nil for a null key or value.
	Key     *string `json:"key"`
	Payload *string `json:"payload"`
	// Headers are in order as name, value pairs (names may repeat).
	Headers []KcatHeader `json:"-"`
}

// KcatHeader is one record header.
type KcatHeader struct {
	Key, Value string
}

// Header returns the value of the first header named key.
func (m KcatMessage) Header(key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// KcatConsume runs `kcat -C -e -o beginning -J` against the broker and
// returns every message of topic, in the order kcat printed them (offset
// order within a partition). kcat talks to kfake with its defaults
// (api.version.request=true negotiates the versions kfake offers); no
// -X option is needed. The test fails if kcat fails or times out (60s).
func (k *KafkaBroker) KcatConsume(t testing.TB, topic string) []KcatMessage {
	t.Helper()
	return KcatConsume(t, k.Addr(), topic)
}

// KcatConsume is KafkaBroker.KcatConsume for any broker list (comma
// separated host:port).
func KcatConsume(t testing.TB, brokers, topic string) []KcatMessage {
	t.Helper()
	bin := Kcat(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-b", brokers, "-C", "-t", topic, "-e", "-o", "beginning", "-J", "-q",
		"-X", "socket.timeout.ms=10000", "-X", "topic.metadata.refresh.interval.ms=1000",
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: %s: %v\nstderr:\n%s", cmd.String(), err, stderr.String())
	}
	msgs, err := parseKcatJSON(stdout.Bytes())
	if err != nil {
		t.Fatalf("testenv: parse kcat output: %v\nstderr:\n%s", err, stderr.String())
	}
	return msgs
}

// parseKcatJSON decodes kcat's -J output: one JSON object per line, headers
// as a flat ["name", "value", …] array.
func parseKcatJSON(out []byte) ([]KcatMessage, error) {
	var msgs []KcatMessage
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var m struct {
			KcatMessage
			Headers []string `json:"headers"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("line %q: %w", truncate(line, 200), err)
		}
		if len(m.Headers)%2 != 0 {
			return nil, fmt.Errorf("odd header list %q", m.Headers)
		}
		msg := m.KcatMessage
		for i := 0; i < len(m.Headers); i += 2 {
			msg.Headers = append(msg.Headers, KcatHeader{Key: m.Headers[i], Value: m.Headers[i+1]})
		}
		msgs = append(msgs, msg)
	}
	return msgs, sc.Err()
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// KcatTopics runs `kcat -L -J` (metadata of every topic, which creates
// none) against brokers (comma-separated host:port) and returns the
// topics and their partition counts. The test fails if kcat fails or
// times out (60s).
func KcatTopics(t testing.TB, brokers string) map[string]int {
	t.Helper()
	bin := Kcat(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-b", brokers, "-L", "-J", "-X", "socket.timeout.ms=10000")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: %s: %v\nstderr:\n%s", cmd.String(), err, stderr.String())
	}
	var md struct {
		Topics []struct {
			Topic      string            `json:"topic"`
			Partitions []json.RawMessage `json:"partitions"`
		} `json:"topics"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &md); err != nil {
		t.Fatalf("testenv: parse kcat -L -J output: %v\n%s", err, stdout.String())
	}
	out := make(map[string]int, len(md.Topics))
	for _, tp := range md.Topics {
		out[tp.Topic] = len(tp.Partitions)
	}
	return out
}
