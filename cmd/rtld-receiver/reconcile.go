package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
)

// reconcileFlags are the --reconcile.* flags and --profile.downsampling-percent.
type reconcileFlags struct {
	delay, interval, giveUp time.Duration
	counts, replica, leader string
	downsampling            string
}

func (f *reconcileFlags) add(app *cli.App) {
	app.Flag("reconcile.delay", "How long after a FIVE_MINUTES bucket ends its accepted log records are compared with the Metrics API's requests (edge_usage_by_country, app.metrics scope): both sources settled and the platform's retries in. 0 turns reconciliation off.").
		Default(reconcile.DefaultDelay.String()).DurationVar(&f.delay)
	app.Flag("reconcile.interval", "How often due buckets are compared.").Default(reconcile.DefaultInterval.String()).DurationVar(&f.interval)
	app.Flag("reconcile.give-up", "How long a due bucket waits for the Metrics API, the profile's state or ClickHouse before it is skipped (edgepipe_rtld_reconcile_skipped_buckets_total).").
		Default(reconcile.DefaultGiveUpAfter.String()).DurationVar(&f.giveUp)
	app.Flag("reconcile.counts", "Where the records of a bucket are counted: spool (what this receiver accepted; one replica) or clickhouse (access_logs under FINAL, exact across replicas; needs --clickhouse.dsn).").
		Default(reconcile.CountsSpool).EnumVar(&f.counts, reconcile.CountsSpool, reconcile.CountsClickHouse)
	app.Flag("reconcile.replica", "This receiver's name among the replicas (default: the host name, the pod's name in a StatefulSet).").PlaceHolder("NAME").StringVar(&f.replica)
	app.Flag("reconcile.leader", "With several replicas and --reconcile.counts=clickhouse: the one replica that compares and publishes the edgepipe_rtld_reconciled_* metrics and log_completeness (the others only report their delivery progress). Empty: this one.").
		PlaceHolder("NAME").StringVar(&f.leader)
	app.Flag("profile.downsampling-percent", "The profile's downsampling_percent: "+percents()+". Unset keeps the profile's own (the operator's cost decision, never reverted); reconciliation compares each bucket with the share in force for it.").
		PlaceHolder("PERCENT").HintOptions(strings.Split(percents(), ", ")...).StringVar(&f.downsampling)
}

// percents lists rtld.DownsamplingPercents.
func percents() string {
	out := make([]string, len(rtld.DownsamplingPercents))
	for i, p := range rtld.DownsamplingPercents {
		out[i] = strconv.FormatFloat(p, 'g', -1, 64)
	}
	return strings.Join(out, ", ")
}

// downsamplingPercent returns the --profile.downsampling-percent value, nil
// when unset.
func (f *reconcileFlags) downsamplingPercent() (*float64, error) {
	if f.downsampling == "" {
		return nil, nil
	}
	p, err := strconv.ParseFloat(strings.TrimSuffix(f.downsampling, "%"), 64)
	if err != nil || !slices.Contains(rtld.DownsamplingPercents, p) {
		return nil, fmt.Errorf("--profile.downsampling-percent %q: the platform accepts %s", f.downsampling, percents())
	}
	return &p, nil
}

// config returns the reconciliation's configuration (nil when off) for a
// receiver whose platform client is client, reading the platform's time
// from clock (the client's DateObserver).
func (f *reconcileFlags) config(client *platform.Client, clock *reconcile.PlatformTime, profileName string) *reconcile.Config {
	if f.delay == 0 {
		return nil
	}
	return &reconcile.Config{
		Delay: f.delay, Interval: f.interval, GiveUpAfter: f.giveUp, Counts: f.counts, Replica: f.replica, Leader: f.leader,
		Metrics: metricsapi.NewClient(client.Metrics()), Clock: clock, ProfileName: profileName,
	}
}

// check refuses settings that cannot work together.
func (f *reconcileFlags) check(clickhouseDSN string) error {
	if f.delay < 0 || f.interval <= 0 || f.giveUp <= 0 {
		return fmt.Errorf("--reconcile.delay (%s) must not be negative, --reconcile.interval (%s) and --reconcile.give-up (%s) must be positive", f.delay, f.interval, f.giveUp)
	}
	if f.delay > 0 && f.counts == reconcile.CountsClickHouse && clickhouseDSN == "" {
		return errors.New("--reconcile.counts=clickhouse needs --clickhouse.dsn")
	}
	return nil
}
