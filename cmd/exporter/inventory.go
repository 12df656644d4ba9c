package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// newInventory builds the inventory of the run command and registers it
// on reg: environments' names always (cdn_environment_info), TLS
// certificates unless --inventory.interval is 0, handed to pub (the
// ClickHouse tables) when an extension provides one. Its goroutine is
// started by runExporter.
func newInventory(h *host, f *runFlags, cl *apiClients, clock schedule.Clock, pub inventory.Publisher, reg prometheus.Registerer) (*inventory.Inventory, error) {
	cfg := inventory.Config{
		Interval: f.inventoryInterval,
		// Replicas list their shards at once, with one API client's budget.
		RequestGap: inventory.DefaultRequestGap * time.Duration(max(1, h.common.shard.Count)),
		Accounts:   cl.Accounts,
		Publisher:  pub,
		Prefix:     h.common.config.Prefix,
		Clock:      clock,
		Logger:     h.log.With("component", "inventory"),
	}
	if f.inventoryInterval > 0 {
		cfg.Certificates = cl.Config
	}
	inv, err := inventory.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(inv); err != nil {
		return nil, fmt.Errorf("register the inventory's metrics: %w", err)
	}
	if cfg.Certificates == nil {
		h.log.Info("TLS certificate inventory off (--inventory.interval=0)")
	} else {
		h.log.Info("TLS certificate inventory enabled", "interval", f.inventoryInterval, "clickhouse", pub != nil)
	}
	return inv, nil
}
