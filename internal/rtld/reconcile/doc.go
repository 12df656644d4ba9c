// Package reconcile checks the platform's log delivery against its Metrics
// API: for every served environment and FIVE_MINUTES bucket, once both have
// settled (Config.Delay after the bucket ends), the records the receiver
// accepted whose timestamp falls in the bucket are compared with the
// requests_edge_total of edge_usage_by_country (all countries) at the
// profile's sampling share, accesslog.SampledCount(requests, percent).
// Results go to the edgepipe_rtld_reconciled_* counters and, with
// ClickHouse, to the log_completeness table (one row per environment and
// bucket under FINAL, written again when records arrive after the
// comparison). A bucket that cannot be compared honestly is skipped with a
// reason (Reasons), never reported as a loss.
//
// # Time
//
// Buckets are the platform's, so every "when" is told on its clock
// (PlatformTime, from the Date headers of the API's answers), and a bucket
// that ended before the receiver started waits Delay after the start: the
// platform resends what it could not deliver meanwhile.
//
// # The profile's state
//
// The profile decides what a bucket should hold: nothing while it is
// disabled or posts elsewhere, part of the bucket in which it was created,
// enabled or changed, and a share of the requests when it is downsampled.
// ProfileTap sees every call the registrar makes (or, without a registrar,
// lists the profiles itself) and records each check as a state between two
// platform times; a bucket is compared only when the same state was seen
// before it began and after it ended. One whose state changed within it
// is partial and skipped (profile_changed, sampling_changed).
//
// # Counts that survive restarts (spool counts)
//
// The records are counted from the spool, by a reader of its own
// (SpoolReaderName), not at ingest: what the spool made durable is exactly
// what was acknowledged. Counts, the spool index counted up to, the batch
// identities counted and the decisions are saved together in one state
// file (package statefile: a torn write leaves the previous content), and
// the reader commits only positions a saved state covers. After SIGTERM or
// SIGKILL the entries after the commit are read again and those below the
// saved index skipped: each batch is counted exactly once, so a crash makes
// neither a false loss nor a false 100%. Ingest stores a batch with
// identity once, but a spool can still hold two copies of one: written by
// a release before that, or after the gap state (gaps.state) was lost, so
// that ingest took a resend for a new batch; the identities counted make
// the second copy count nothing. What cannot be recovered is skipped as
// counts_lost: a state file found damaged (every bucket before the
// restart), spool entries found damaged (the buckets before them).
//
// Decisions are saved before the counters move and the table rows are
// written after, from saved state: after a crash a bucket is decided at
// most once more, with the same numbers.
//
// # Replicas (ClickHouse counts)
//
// Replicas behind one address each spool part of a bucket, and a batch the
// platform resends may land on another replica than its first copy, so no
// replica's own counts are right. With CountsClickHouse the records are
// counted in access_logs under FINAL, which holds every record once across
// replicas, and one replica (Config.Leader) compares; the others publish no
// reconciliation series, so sums over replicas are right. A bucket is
// counted only once every replica reported (the log_delivery_progress
// table) that everything it accepted up to the bucket's due time is in
// ClickHouse; a replica that stopped with its spool delivered holds
// nothing, one that has been silent for long holds nothing of buckets that
// began after its last report, and one still behind after GiveUpAfter
// makes the bucket replica_behind.
package reconcile
