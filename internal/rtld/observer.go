package rtld

import "github.com/edgepipe/edgepipe/internal/accesslog"

// SpoolObserver is told about every batch ingest has just made durable in
// the spool, before the batch is acknowledged: never about a batch
// acknowledged as a duplicate without being stored, nor about one refused
// (4xx, 5xx). A batch the platform resent before the gap tracker noticed its
// first copy, or two copies arriving at once, can be spooled (and observed)
// twice; an observer that must count every batch once recognises them by
// their identity (accesslog.Batch.HasIdentity).
//
// ObserveSpooled runs on the request's goroutine, so it must be cheap and
// safe for concurrent use, and it must not keep b or its records after it
// returns: they live in ingest's reused buffers.
type SpoolObserver interface {
	ObserveSpooled(b *accesslog.Batch)
}
