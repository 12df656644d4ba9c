package rtld

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestIngestConfigWithDefaults(t *testing.T) {
	defaults := IngestConfig{
		MaxBodyBytes: DefaultMaxBodyBytes, MaxDecodedBytes: DefaultMaxDecodedBytes, MaxMemoryBytes: DefaultMaxMemoryBytes,
		MaxRecordBytes: DefaultMaxRecordBytes, MaxInFlight: DefaultMaxInFlight,
		BodyTimeout: DefaultBodyTimeout, QueueWait: DefaultQueueWait, RetryAfter: DefaultRetryAfter,
	}
	set := IngestConfig{
		Username: "u", Password: "p", MaxBodyBytes: 1 << 20, MaxDecodedBytes: 2 << 20, MaxMemoryBytes: 8 << 20,
		MaxRecordBytes: 1 << 10, MaxInFlight: 2, BodyTimeout: time.Second, QueueWait: time.Millisecond, RetryAfter: time.Minute,
	}
	negative := IngestConfig{MaxInFlight: -1, BodyTimeout: -time.Second}
	for _, tc := range []struct {
		name    string
		in, out IngestConfig
	}{
		{"zero takes every default", IngestConfig{}, defaults},
		{"set values are kept", set, set},
		{"negative values are kept for Validate to refuse", negative, func() IngestConfig {
			c := defaults
			c.MaxInFlight, c.BodyTimeout = -1, -time.Second
			return c
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.WithDefaults(); !reflect.DeepEqual(got, tc.out) {
				t.Errorf("got %+v\nwant %+v", got, tc.out)
			}
		})
	}
}

func TestIngestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*IngestConfig)
		want []string // substrings of the error; none: valid
	}{
		{"defaults", func(*IngestConfig) {}, nil},
		{"memory for exactly one request", func(c *IngestConfig) {
			c.MaxMemoryBytes = MinMemoryBytes(c.MaxBodyBytes, c.MaxDecodedBytes)
		}, nil},
		{"memory below one request", func(c *IngestConfig) {
			c.MaxMemoryBytes = MinMemoryBytes(c.MaxBodyBytes, c.MaxDecodedBytes) - 1
		}, []string{"cannot hold one request"}},
		{"negative sizes and durations, all named", func(c *IngestConfig) {
			c.MaxBodyBytes, c.MaxInFlight, c.QueueWait = -1, -2, -time.Second
		}, []string{"MaxBodyBytes -1", "MaxInFlight -2", "QueueWait -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := IngestConfig{}.WithDefaults()
			tc.mut(&c)
			testenv.CheckErr(t, c.Validate(), tc.want)
		})
	}
}

func TestRegistrarConfigWithDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   RegistrarConfig
		want RegistrarConfig
	}{
		{"zero takes every default", RegistrarConfig{},
			RegistrarConfig{ProfileName: DefaultProfileName, Description: DefaultProfileDescription, Interval: DefaultRegisterInterval}},
		{"set values are kept", RegistrarConfig{ProfileName: "p", Description: "d", Interval: time.Second},
			RegistrarConfig{ProfileName: "p", Description: "d", Interval: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.ProfileName != tc.want.ProfileName || got.Description != tc.want.Description || got.Interval != tc.want.Interval {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRegistrarConfigValidate(t *testing.T) {
	valid := RegistrarConfig{EnvironmentIDs: []string{"e"}, PublicURL: "https://rx.example.com/base", Username: "u", Password: "p"}
	for _, tc := range []struct {
		name string
		mut  func(*RegistrarConfig)
		want []string
	}{
		{"valid", func(*RegistrarConfig) {}, nil},
		{"blank environment IDs only", func(c *RegistrarConfig) { c.EnvironmentIDs = []string{" ", ""} }, []string{"no environment IDs"}},
		{"negative interval", func(c *RegistrarConfig) { c.Interval = -time.Minute }, []string{"Interval -1m0s"}},
		{"a downsampling percent the platform refuses", func(c *RegistrarConfig) { p := 10.0; c.DownsamplingPercent = &p }, []string{"downsampling percent 10"}},
		{"a downsampling percent it takes", func(c *RegistrarConfig) { p := 0.1; c.DownsamplingPercent = &p }, nil},
		{"every problem at once", func(c *RegistrarConfig) {
			c.PublicURL, c.Username, c.ProfileName = "http://x", "a:b", strings.Repeat("n", 37)
		}, []string{"https", "colon", "36"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			tc.mut(&c)
			testenv.CheckErr(t, c.withDefaults().validate(), tc.want)
		})
	}
}
