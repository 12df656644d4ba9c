package main

import (
	"fmt"

	"github.com/alecthomas/units"

	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// checkSizes refuses size flags that cannot work together, naming them, so
// a receiver never starts wedged (a spool bound below two segments answers
// 503 forever) or unable to take the batches it allows.
func checkSizes(f *flags) error {
	ic := rtld.IngestConfig{
		MaxBodyBytes: int64(f.maxBodyBytes), MaxDecodedBytes: int64(f.maxDecodedBytes), MaxMemoryBytes: int64(f.maxMemoryBytes),
	}.WithDefaults()
	if need := rtld.MinMemoryBytes(ic.MaxBodyBytes, ic.MaxDecodedBytes); ic.MaxMemoryBytes < need {
		return fmt.Errorf("--ingest.max-memory-bytes=%s cannot hold one request of --ingest.max-body-bytes=%s (as sent) and --ingest.max-decoded-bytes=%s (decompressed): it must be at least %s",
			size(ic.MaxMemoryBytes), size(ic.MaxBodyBytes), size(ic.MaxDecodedBytes), sizeUp(need))
	}
	maxBytes := int64(f.spoolMaxBytes)
	if maxBytes <= 0 {
		return nil
	}
	seg, segFlag := int64(f.spoolSegmentBytes), "--spool.segment-bytes="+size(int64(f.spoolSegmentBytes))
	if seg <= 0 {
		seg, segFlag = spool.SegmentBytesFor(maxBytes), "segments of "+size(spool.SegmentBytesFor(maxBytes))
	}
	if need := spool.MinMaxBytes(seg, rtld.SpoolEntryBytes(ic.MaxDecodedBytes)); maxBytes < need {
		return fmt.Errorf("--spool.max-bytes=%s is too small for %s and batches of up to --ingest.max-decoded-bytes=%s: the spool frees whole segments, so it must hold two, each with room for the largest batch: at least %s (raise --spool.max-bytes or lower the others)",
			size(maxBytes), segFlag, size(ic.MaxDecodedBytes), sizeUp(need))
	}
	return nil
}

func size(n int64) string { return units.Base2Bytes(n).String() }

// sizeUp prints n rounded up to whole MiB.
func sizeUp(n int64) string { return size((n + 1<<20 - 1) >> 20 << 20) }
