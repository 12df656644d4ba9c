package platformsim

import (
	"math"
	"reflect"
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
		scale                    float64
	}{
		{"zero takes every default", Config{}, DefaultTokenLifetime, DefaultLateData, DefaultProperties, DefaultEnvironments, DefaultTrafficScale},
		{"negative late data means none", Config{LateData: -1}, DefaultTokenLifetime, 0, DefaultProperties, DefaultEnvironments, DefaultTrafficScale},
		{"set values are kept", Config{TokenLifetime: time.Second, LateData: time.Minute, Properties: 1, Environments: 2, TrafficScale: 0.25},
			time.Second, time.Minute, 1, 2, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.TokenLifetime != tc.token || got.LateData != tc.late || got.Properties != tc.properties || got.Environments != tc.environments ||
				got.TrafficScale != tc.scale {
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
	if got := (DeliveryConfig{}).withDefaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("zero: got %+v, want %+v", got, want)
	}
	set := DeliveryConfig{Live: true, BatchSize: 1, FlushInterval: time.Millisecond, AgentsPerEnvironment: 4, RetryInterval: time.Second,
		Retention: time.Hour, RequestTimeout: time.Minute, MaxTrackedUUIDs: -1,
		Faults: DeliveryFaults{Environments: map[string]EnvironmentFaults{"e": {DropBatchPercent: 10}}}}
	if got := set.withDefaults(); !reflect.DeepEqual(got, set) {
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
			c.Delivery.BatchSize, c.Delivery.Faults.DropAckPercent = -1, 101
			c.Delivery.Faults.Environments = map[string]EnvironmentFaults{
				"env-a": {DropBatchPercent: -1, DropRecordPercent: math.NaN()},
				"env-b": {DropRecordPercent: 100.5, Late: -time.Second},
			}
		}, []string{"delivery: BatchSize -1", "DropAckPercent 101", "environment env-a: DropBatchPercent -1", "environment env-a: DropRecordPercent NaN",
			"environment env-b: DropRecordPercent 100.5", "environment env-b: Late -1s"}},
		{"traffic scale", func(c *Config) { c.TrafficScale = -0.5 }, []string{"TrafficScale -0.5"}},
		{"traffic scale too big", func(c *Config) { c.TrafficScale = MaxTrafficScale * 2 }, []string{"TrafficScale 2000"}},
		{"traffic scale NaN", func(c *Config) { c.TrafficScale = math.NaN() }, []string{"TrafficScale NaN"}},
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
