package main

import (
	"fmt"
	"log/slog"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// simulation is the platform simulator --simulate runs in-process: the only
// part of the exporter that links the simulator.
type simulation struct {
	// cfg configures the simulator (tests).
	cfg platformsim.Config
	srv *platformsim.Server
}

// start starts the simulator on 127.0.0.1:0, unless it runs already, and
// points c at it with the demo credentials, serving the demo organization
// unless environments or organizations were given. The returned function
// stops it.
func (s *simulation) start(c *commonFlags, log *slog.Logger) (stop func(), err error) {
	if s.srv != nil {
		return func() {}, nil
	}
	srv, err := platformsim.New(s.cfg)
	if err != nil {
		return nil, fmt.Errorf("the simulator: %w", err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start the simulator: %w", err)
	}
	s.srv = srv
	c.apiURL, c.authURL = base, base
	c.clientID, c.clientSecret = platformsim.DemoClientID, platformsim.DemoClientSecret
	if len(c.environmentIDs) == 0 && len(c.organizationIDs) == 0 {
		c.organizationIDs = []string{platformsim.DemoOrganizationID}
	}
	log.Info("simulator started", "url", base, "organization", platformsim.DemoOrganizationID,
		"environments", len(srv.EnvironmentIDs()))
	return func() { srv.Close() }, nil
}
