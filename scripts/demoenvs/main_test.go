package main

import (
	"context"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func TestEnvironmentsFromSimulator(t *testing.T) {
	sim, err := platformsim.New(platformsim.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := environments(ctx, base, platformsim.DemoOrganizationID, platformsim.DemoClientID, platformsim.DemoClientSecret)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) == 0 {
		t.Fatal("no environments")
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if id == "" || seen[id] {
			t.Fatalf("empty or duplicate ID %q in %v", id, ids)
		}
		seen[id] = true
	}
	if _, err := environments(ctx, base, platformsim.DemoOrganizationID, platformsim.DemoClientID, "wrong"); err == nil {
		t.Fatal("wrong secret accepted")
	}
}
