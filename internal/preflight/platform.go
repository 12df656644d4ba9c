package preflight

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// CheckCredentials is the name of the Platform.Credentials check.
const CheckCredentials = "credentials"

// ScopeCheck is the name of the Platform.Scope check of scope.
func ScopeCheck(scope string) string { return "scope " + scope }

// Platform is what the checks of the platform's API share.
type Platform struct {
	// Client is the API client, built as the program builds it, with one
	// attempt per call (platform.RetryConfig.MaxAttempts 1).
	Client *platform.Client
	// ClientID names the API client in messages; AuthURL and APIURL are
	// --auth.url and --api.url.
	ClientID, AuthURL, APIURL string
}

// ScopeUse is a scope the configuration needs.
type ScopeUse struct {
	// Scope is the scope, e.g. platform.ScopeMetrics.
	Scope string
	// For says what the program needs it for ("polling the Metrics API").
	For string
	// Otherwise says how to run without it ("--inventory.interval=0 turns
	// the certificate inventory off"); empty when the program cannot.
	Otherwise string
	// Probe makes one read request the scope authorises and says what it
	// found. The scope is refused when the error is a refusal
	// (platform.IsRefused).
	Probe func(ctx context.Context) (string, error)
	// Needs are the checks Probe needs besides the token (the environments
	// for a request about one).
	Needs []string
}

// Credentials is the check "credentials": the token endpoint issues a
// token to the API client for scope (the first one the configuration
// needs). A token endpoint that authenticates the client but refuses the
// scope passes: the scope's own check says so.
func (p *Platform) Credentials(scope string) Check {
	return Check{Name: CheckCredentials, Run: func(ctx context.Context) Result {
		url := platform.TokenURL(p.AuthURL)
		_, err := p.Client.Token(ctx, scope)
		switch {
		case err == nil:
			return Pass("%s issues tokens to API client %s", url, p.ClientID)
		case platform.IsScopeRefused(err):
			return Pass("%s accepts API client %s (it refuses scope %s: see that check)", url, p.ClientID, scope)
		case platform.IsClientRefused(err), platform.StatusCode(err) == http.StatusUnauthorized:
			return Fail("%s refuses API client %s: wrong client ID or secret, or the secret was deleted (%v); "+
				"set $EDGEPIPE_CLIENT_ID and the client secret ($EDGEPIPE_CLIENT_SECRET, a file named by $EDGEPIPE_CLIENT_SECRET_FILE, or --client-secret-file) to a current secret of the API client",
				url, p.ClientID, err)
		}
		return Fail("%v; check --auth.url (tokens come from <auth.url>/connect/token, here %s) and that this machine reaches it", err, url)
	}}
}

// Scope is the check "scope <scope>": the token endpoint grants the scope
// to the API client, and the API answers one request authorised by it.
func (p *Platform) Scope(u ScopeUse) Check {
	return Check{Name: ScopeCheck(u.Scope), Needs: append([]string{CheckCredentials}, u.Needs...), Run: func(ctx context.Context) Result {
		grant := fmt.Sprintf("grant scope %s to API client %s in the platform's console (the API client's allowed scopes); the program needs it for %s", u.Scope, p.ClientID, u.For)
		if u.Otherwise != "" {
			grant += ", or " + u.Otherwise
		}
		granted, err := p.Client.Token(ctx, u.Scope)
		switch {
		case platform.IsRefused(err):
			return Fail("the token endpoint refuses it: %v; %s", err, grant)
		case err != nil:
			return Fail("%v", err)
		case granted != "" && !scopeGranted(granted, u.Scope):
			return Fail("the token endpoint granted %q instead; %s", granted, grant)
		}
		found, err := u.Probe(ctx)
		switch {
		case platform.IsRefused(err):
			return Fail("token issued, but the API refuses it: %v; %s", err, grant)
		case err != nil:
			return Fail("token issued, but %v; %s", err, apiHint(err, p.APIURL))
		}
		return Pass("granted; %s", found)
	}}
}

// apiHint says what to look at after a request to the API failed.
func apiHint(err error, apiURL string) string {
	var e *platform.Error
	if errors.As(err, &e) && e.Status != http.StatusNotFound {
		return "the platform answered the request (try again later if it is a 429 or 5xx)"
	}
	return "check --api.url (" + apiURL + ": the platform's base_url) and that this machine reaches it"
}

// scopeGranted reports whether the granted scopes (space- or
// plus-separated) include want or a broader scope that covers it
// ("app" covers "app.metrics").
func scopeGranted(granted, want string) bool {
	for _, g := range strings.FieldsFunc(granted, func(r rune) bool { return r == ' ' || r == '+' }) {
		if g == want || strings.HasPrefix(want, g) && (want[len(g)] == '.' || want[len(g)] == ':') {
			return true
		}
	}
	return false
}
