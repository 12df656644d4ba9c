package platformsim

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestConfigWithDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		in                       Config
		token, late              time.Duration
		properties, environments int
	}{
		{"zero takes every default", Config{}, DefaultTokenLifetime, DefaultLateData, DefaultProperties, DefaultEnvironments},
		{"negative late data means none", Config{LateData: -1}, DefaultTokenLifetime, 0, DefaultProperties, DefaultEnvironments},
		{"set values are kept", Config{TokenLifetime: time.Second, LateData: time.Minute, Properties: 1, Environments: 2}, time.Second, time.Minute, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.TokenLifetime != tc.token || got.LateData != tc.late || got.Properties != tc.properties || got.Environments != tc.environments {
				t.Errorf("got %+v", got)
			}
			if len(got.Clients) == 0 || got.Faults.RetryAfter != DefaultRetryAfter || got.Delivery.BatchSize != DefaultBatchSize {
				t.Errorf("clients %v, faults %+v, delivery %+v: nested defaults missing", got.Clients, got.Faults, got.Delivery)
			}
		})
	}
}

func TestFaultsWithDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Faults
		want Faults
	}{
		{"zero", Faults{}, Faults{RetryAfter: DefaultRetryAfter}},
		{"bad values get the default rate", Faults{BadValues: BadNaN}, Faults{BadValues: BadNaN, BadValueRate: DefaultBadValueRate, RetryAfter: DefaultRetryAfter}},
		{"set values are kept", Faults{BadValues: BadText, BadValueRate: 1, RetryAfter: time.Minute, Rate429: 0.5},
			Faults{BadValues: BadText, BadValueRate: 1, RetryAfter: time.Minute, Rate429: 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.withDefaults(); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDeliveryConfigWithDefaults(t *testing.T) {
	want := DeliveryConfig{BatchSize: DefaultBatchSize, FlushInterval: DefaultFlushInterval, AgentsPerEnvironment: DefaultAgentsPerEnvironment,
		RetryInterval: DefaultRetryInterval, Retention: DefaultDeliveryRetention, RequestTimeout: DefaultRequestTimeout, MaxTrackedUUIDs: DefaultMaxTrackedUUIDs}
	if got := (DeliveryConfig{}).withDefaults(); got != want {
		t.Errorf("zero: got %+v, want %+v", got, want)
	}
	set := DeliveryConfig{RecordsPerSecond: 2, BatchSize: 1, FlushInterval: time.Millisecond, AgentsPerEnvironment: 4, RetryInterval: time.Second,
		Retention: time.Hour, RequestTimeout: time.Minute, MaxTrackedUUIDs: -1}
	if got := set.withDefaults(); got != set {
		t.Errorf("set: got %+v, want %+v", got, set)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want []string
	}{
		{"defaults", func(*Config) {}, nil},
		{"negative world", func(c *Config) { c.Properties, c.TokenLifetime = -1, -time.Second }, []string{"-1 properties", "TokenLifetime -1s"}},
		{"a client without a secret", func(c *Config) { c.Clients = []Client{{ID: "x"}} }, []string{`client "x"`}},
		{"fault shares outside 0..1", func(c *Config) { c.Faults.Rate429, c.Faults.MalformedRowRate = 1.5, math.NaN() },
			[]string{"faults: Rate429 1.5", "MalformedRowRate NaN"}},
		{"unknown bad value", func(c *Config) { c.Faults.BadValues = "zero" }, []string{`unknown BadValues "zero"`}},
		{"delivery problems are named as such", func(c *Config) {
			c.Delivery.RecordsPerSecond, c.Delivery.BatchSize, c.Delivery.Faults.DropAckPercent = math.Inf(1), -1, 101
		}, []string{"delivery: RecordsPerSecond +Inf", "BatchSize -1", "DropAckPercent 101"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
	if _, err := New(Config{Environments: -3}); err == nil || !strings.Contains(err.Error(), "platform simulator: invalid configuration") {
		t.Errorf("New with -3 environments: %v", err)
	}
}
