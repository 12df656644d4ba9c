package main

import (
	"strings"
	"testing"
)

func TestCheckSizesRefusesCombinationsThatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // substring of the error; empty: accepted
	}{
		{nil, ""},
		// The chart's old spool.size 50Mi: 45 MiB.
		{[]string{"--spool.max-bytes=45MiB"}, "--spool.max-bytes=45MiB is too small for segments of 2MiB and batches of up to --ingest.max-decoded-bytes=32MiB"},
		{[]string{"--spool.max-bytes=45MiB", "--ingest.max-decoded-bytes=8MiB"}, ""},
		{[]string{"--spool.max-bytes=150MiB", "--spool.segment-bytes=64MiB"}, "--spool.max-bytes=150MiB is too small for --spool.segment-bytes=64MiB"},
		{[]string{"--ingest.max-memory-bytes=32MiB"}, "--ingest.max-memory-bytes=32MiB cannot hold one request of --ingest.max-body-bytes=16MiB"},
		{[]string{"--ingest.max-memory-bytes=64MiB"}, ""},
	} {
		f, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		err = checkSizes(f)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: refused: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
}
