package deadletter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// ReplayReport says what a replay did.
type ReplayReport struct {
	// Files is how many files were replayed.
	Files int
	// Delivered counts the records the sink acknowledged (removed from the
	// store); Rejected those it rejected again (kept, with the new error).
	Delivered, Rejected int
}

// Replay delivers the dead letters of sink again through d (the same
// delivery code the worker uses), oldest file first. Records the sink
// acknowledges are removed from the store; records it rejects again stay,
// with the new reason and error and their replay count raised. While the
// sink fails, d retries until ctx ends; Replay then returns what it did and
// ctx's error, and what was not replayed stays in the store.
//
// Replay is safe while the receiver runs: it reads only files that existed
// when it started (the receiver only adds new ones). Two replays of one
// sink at once are refused.
func (s *Store) Replay(ctx context.Context, sink string, d *delivery.Deliverer) (ReplayReport, error) {
	var rep ReplayReport
	dir := filepath.Join(s.opts.Dir, sink)
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return rep, nil
	}
	unlock, err := lockReplay(dir)
	if err != nil {
		return rep, fmt.Errorf("replaying the dead letters of %s: %w", sink, err)
	}
	defer unlock()
	files, err := s.Files(sink)
	if err != nil {
		return rep, err
	}
	for _, f := range files {
		delivered, rejected, err := s.replayFile(ctx, f, d)
		rep.Delivered += delivered
		rep.Rejected += rejected
		if err != nil {
			return rep, err
		}
		rep.Files++
	}
	return rep, nil
}

// replayFile replays one file and then removes it, after writing the
// records rejected again to a new file.
func (s *Store) replayFile(ctx context.Context, f File, d *delivery.Deliverer) (delivered, rejected int, err error) {
	letters, err := ReadLetters(f.Path)
	if err != nil {
		return 0, 0, err
	}
	batches := make([]*accesslog.Batch, len(letters))
	byRecord := make(map[*byte]int, len(letters)) // a record's first byte → its letter
	for i := range letters {
		batches[i] = letters[i].Batch()
		if rec := batches[i].Records[0]; len(rec) > 0 {
			byRecord[&rec[0]] = i
		}
	}
	rejections, err := d.Deliver(ctx, batches, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("replaying %s: %w", f.Path, err)
	}
	var again []Letter
	for _, r := range rejections {
		rec := r.Batch.Records[0]
		i, ok := 0, false
		if len(rec) > 0 {
			i, ok = byRecord[&rec[0]]
		}
		if !ok {
			// Cannot happen (rejections alias the letters' records); keep
			// the file rather than lose a record.
			return 0, 0, fmt.Errorf("replaying %s: a rejected record matches no letter; the file is kept", f.Path)
		}
		l := letters[i]
		l.Reason, l.Replays = r.Reason, l.Replays+1
		if r.Err != nil {
			l.Error = r.Err.Error()
		}
		again = append(again, l)
	}
	dir := filepath.Dir(f.Path)
	if len(again) > 0 {
		enc := make([][]byte, len(again))
		for i, l := range again {
			if enc[i], err = encodeLetter(l); err != nil {
				return 0, 0, err
			}
		}
		s.mu.Lock()
		s.seq++
		name := fileName(again[0].Time, s.seq, len(again))
		s.mu.Unlock()
		if err := writeFile(dir, name, joinLetters(enc)); err != nil {
			return 0, 0, err
		}
	}
	if err := os.Remove(f.Path); err != nil {
		return 0, 0, fmt.Errorf("removing replayed dead letters: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return 0, 0, err
	}
	return len(letters) - len(again), len(again), nil
}
