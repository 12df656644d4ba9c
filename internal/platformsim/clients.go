package platformsim

// DemoScopes are the scopes of the services the simulator serves, all of
// which the default demo client holds.
func DemoScopes() []string {
	return []string{ScopeMetrics, ScopeAccounts, ScopeRTLD, ScopeConfig}
}

// DemoClient returns the demo client (DemoClientID, DemoClientSecret) with
// the given scopes, or with DemoScopes when none are given. Tests use it to
// run the demo credentials without a scope, e.g.
// Config{Clients: []Client{DemoClient(ScopeMetrics, ScopeAccounts)}} for a
// client the config service refuses.
func DemoClient(scopes ...string) Client {
	if len(scopes) == 0 {
		scopes = DemoScopes()
	}
	return Client{ID: DemoClientID, Secret: DemoClientSecret, Scopes: append([]string(nil), scopes...)}
}
