package platform

import (
	"strings"
	"testing"
	"time"
)

func TestConfigWithDefaults(t *testing.T) {
	set := Config{Timeout: time.Second, Retry: RetryConfig{MaxAttempts: 1, MaxElapsed: time.Minute, InitialInterval: time.Millisecond, MaxInterval: time.Second},
		MaxResponseBytes: 10, Version: "v1"}
	for _, tc := range []struct {
		name string
		in   Config
		want Config
	}{
		{"zero takes every default", Config{}, Config{Timeout: DefaultTimeout, Retry: RetryConfig{MaxAttempts: DefaultMaxAttempts, MaxElapsed: DefaultMaxElapsed,
			InitialInterval: DefaultInitialInterval, MaxInterval: DefaultMaxInterval}, MaxResponseBytes: DefaultMaxResponseBytes, Version: "dev"}},
		{"set values are kept", set, set},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.withDefaults()
			if got.Timeout != tc.want.Timeout || got.Retry != tc.want.Retry || got.MaxResponseBytes != tc.want.MaxResponseBytes || got.Version != tc.want.Version {
				t.Errorf("got %+v %+v, want %+v %+v", got, got.Retry, tc.want, tc.want.Retry)
			}
		})
	}
}

func TestConfigValidateNamesEveryProblem(t *testing.T) {
	c := Config{BaseURL: "api.example", AuthURL: "https://id.example/?q=1", ClientSecret: testClientSecret,
		Retry: RetryConfig{MaxAttempts: -1}, RateLimits: map[string]Limits{"metrics": {Write: RateLimit{Requests: 1, Burst: 2}}}}
	err := c.withDefaults().validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"base URL", "auth URL", "must not carry a query", "client ID and client secret", "negative", "metrics write"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), testClientSecret) {
		t.Errorf("error leaks the secret: %v", err)
	}
}
