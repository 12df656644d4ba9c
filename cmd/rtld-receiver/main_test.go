package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseFlagsDefaultsAndLists(t *testing.T) {
	t.Setenv("EDGEPIPE_ENVIRONMENT_ID", "")
	f, err := parseFlags([]string{"--environment-id=a,b", "--environment-id=c", "--kafka.brokers=k1:9092, k2:9092"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.environmentIDs, []string{"a", "b", "c"}) {
		t.Fatalf("environments %q", f.environmentIDs)
	}
	if got := splitList(f.kafkaBrokers); !reflect.DeepEqual(got, []string{"k1:9092", "k2:9092"}) {
		t.Fatalf("brokers %q", got)
	}
	if f.kafkaTopic != "cdn-access-logs" || f.spoolDir != "./data/spool" || f.profileName != "edgepipe" || !f.register ||
		len(*f.web.WebListenAddresses) != 1 || (*f.web.WebListenAddresses)[0] != ":9781" {
		t.Fatalf("defaults: %+v", f)
	}
	if f.spoolMaxBytes != 10<<30 || f.maxDecodedBytes != 32<<20 {
		t.Fatalf("sizes: %d %d", f.spoolMaxBytes, f.maxDecodedBytes)
	}
	t.Setenv("EDGEPIPE_ENVIRONMENT_ID", "x,y")
	if f, err = parseFlags(nil); err != nil || !reflect.DeepEqual(f.environmentIDs, []string{"x", "y"}) {
		t.Fatalf("from the environment: %q %v", f.environmentIDs, err)
	}
}

func TestSecretFromEnvOrFile(t *testing.T) {
	t.Setenv("EDGEPIPE_RTLD_PASSWORD", "from-env")
	if s, _ := secret("EDGEPIPE_RTLD_PASSWORD"); s != "from-env" {
		t.Fatalf("env: %q", s)
	}
	p := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(p, []byte("from-file\n"), 0o600)
	t.Setenv("EDGEPIPE_RTLD_PASSWORD_FILE", p)
	if s, _ := secret("EDGEPIPE_RTLD_PASSWORD"); s != "from-file" {
		t.Fatalf("file: %q", s)
	}
	t.Setenv("EDGEPIPE_RTLD_PASSWORD_FILE", p+".missing")
	if _, err := secret("EDGEPIPE_RTLD_PASSWORD"); err == nil {
		t.Fatal("missing file: no error")
	}
}
