package rtld

import "github.com/edgepipe/edgepipe/internal/accesslog"

// SpoolObserver is told about every batch ingest has just made durable in
// the spool, before the batch is acknowledged: never about a batch
// acknowledged as a duplicate without being stored, nor about one refused
// (4xx, 5xx). Ingest stores a batch with identity (accesslog.Batch.HasIdentity)
// once, however often and however close together the platform posts it
// (GapTracker.Claim), also across restarts, so the observer hears of it
// once (each replica that stores it: a resend routed to another replica is
// stored there too); a batch without identity cannot be recognised and is
// observed at every delivery.
//
// ObserveSpooled runs on the request's goroutine, so it must be cheap and
// safe for concurrent use, and it must not keep b or its records after it
// returns: they live in ingest's reused buffers.
type SpoolObserver interface {
	ObserveSpooled(b *accesslog.Batch)
}
