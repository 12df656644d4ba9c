package exportconfig

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// DatasetSource is the scheduler's DatasetSource under a configuration file:
// it lists the platform's descriptors and hands them on as Config.Select
// chooses them. The first successful listing is checked strictly: a file
// that does not fit fails with an error wrapping schedule.ErrConfig, which
// stops the exporter at start. Later listings are checked leniently (see
// Select) and what no longer fits is logged as a warning whenever it changes.
type DatasetSource struct {
	Source schedule.DatasetSource
	Config *Config
	Logger *slog.Logger // default slog.Default()

	mu       sync.Mutex
	checked  bool
	warnings []string
}

// Datasets lists the descriptors as selected.
func (s *DatasetSource) Datasets(ctx context.Context) ([]metricsapi.Dataset, error) {
	all, err := s.Source.Datasets(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out, warnings, err := s.Config.Select(all, !s.checked)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", schedule.ErrConfig, err)
	}
	s.checked = true
	if !slices.Equal(warnings, s.warnings) {
		log := s.Logger
		if log == nil {
			log = slog.Default()
		}
		for _, w := range warnings {
			log.Warn("config file: "+w, "config_file", s.Config.Source)
		}
		s.warnings = warnings
	}
	return out, nil
}
