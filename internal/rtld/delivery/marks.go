package delivery

import (
	"encoding/json"
	"log/slog"
	"slices"

	"github.com/edgepipe/edgepipe/internal/rtld/statefile"
)

// partitionMarks is the content of PartitionWorker.MarksFile.
type partitionMarks struct {
	// Partitions is the partition count the marks were kept with: a
	// batch's partition depends on it.
	Partitions int `json:"partitions"`
	// Delivered[p] is the spool index below which every batch of
	// partition p is delivered.
	Delivered []uint64 `json:"delivered"`
}

// loadMarks opens MarksFile and returns its marks when they were kept with
// n partitions (nil otherwise, or without a file).
func (w *PartitionWorker) loadMarks(log *slog.Logger, n int) []uint64 {
	if w.MarksFile == "" {
		return nil
	}
	f, data, err := statefile.Open(w.MarksFile, statefile.Options{Capacity: 32 + 21*n})
	if err != nil {
		log.Warn("rtld: cannot open the partitions' delivery marks; after a restart every partition gets the batches after the spool position again", "err", err)
		return nil
	}
	w.marks = f
	if data == nil {
		return nil
	}
	var m partitionMarks
	if err := json.Unmarshal(data, &m); err != nil {
		log.Warn("rtld: unreadable partition delivery marks, ignored", "err", err)
		return nil
	}
	if m.Partitions != n || len(m.Delivered) != n {
		log.Info("rtld: the partition count changed; the partitions' delivery marks do not apply", "was", m.Partitions, "now", n)
		return nil
	}
	return m.Delivered
}

// saveMarks writes every lane's delivery mark to MarksFile (best effort:
// a failure only means more batches sent again after a restart).
func (r *partitionRun) saveMarks() {
	f := r.w.marks
	if f == nil {
		return
	}
	r.mu.Lock()
	m := partitionMarks{Partitions: len(r.lanes), Delivered: make([]uint64, len(r.lanes))}
	for i, l := range r.lanes {
		m.Delivered[i] = max(r.read.Index, l.delivered)
		if p := l.low(); p != nil {
			m.Delivered[i] = max(p.Index, l.delivered)
		}
	}
	r.mu.Unlock()
	if slices.Equal(m.Delivered, r.saved) {
		return
	}
	data, err := json.Marshal(m)
	if err == nil {
		err = f.Write(data)
	}
	if err != nil {
		if !r.marksFailed {
			r.log.Warn("rtld: cannot save the partitions' delivery marks; a restart would send them batches they have", "err", err)
		}
		r.marksFailed = true
		return
	}
	r.saved, r.marksFailed = m.Delivered, false
}

// closeMarks closes MarksFile after the run.
func (r *partitionRun) closeMarks() {
	if f := r.w.marks; f != nil {
		if err := f.Close(); err != nil {
			r.log.Warn("rtld: closing the partitions' delivery marks", "err", err)
		}
		r.w.marks = nil
	}
}
