package cli

import "fmt"

// Environment variables of the platform settings both programs share.
const (
	EnvAPIURL         = "EDGEPIPE_API_URL"
	EnvAuthURL        = "EDGEPIPE_AUTH_URL"
	EnvClientID       = "EDGEPIPE_CLIENT_ID"
	EnvClientSecret   = "EDGEPIPE_CLIENT_SECRET"
	EnvEnvironmentIDs = "EDGEPIPE_ENVIRONMENT_ID"
)

// Platform is where the platform's API is, the API client's credentials and
// the environments to serve: the flags --api.url, --auth.url,
// --environment-id and --client-secret-file, and the variables
// EDGEPIPE_CLIENT_ID and EDGEPIPE_CLIENT_SECRET (or their _FILE variants).
type Platform struct {
	// APIURL is the platform's base_url.
	APIURL string
	// AuthURL is the platform's auth_url; Resolve sets it to APIURL when
	// it is not given.
	AuthURL string
	// EnvironmentIDs are the environments to serve, repeated flags and
	// comma-separated values split by Resolve.
	EnvironmentIDs []string

	clientID, clientSecret *Secret
}

// AddPlatformFlags adds the platform flags to fg.
func AddPlatformFlags(fg FlagGroup) *Platform {
	p := &Platform{clientID: EnvSecret(EnvClientID)}
	fg.Flag("api.url", "The platform's base_url.").Envar(EnvAPIURL).PlaceHolder("URL").StringVar(&p.APIURL)
	fg.Flag("auth.url", "The platform's auth_url; tokens come from <auth.url>/connect/token (default: --api.url).").
		Envar(EnvAuthURL).PlaceHolder("URL").StringVar(&p.AuthURL)
	fg.Flag("environment-id", "Environment to serve (repeatable or comma-separated; the variable is comma-separated).").
		Envar(EnvEnvironmentIDs).PlaceHolder("ID").StringsVar(&p.EnvironmentIDs)
	p.clientSecret = SecretFlag(fg, "client-secret-file", EnvClientSecret,
		"File holding the API client secret (the client ID comes from $"+EnvClientID+" or the file named by $"+EnvClientID+"_FILE).")
	return p
}

// Resolve completes the parsed flags: the environment list split on commas,
// the auth URL defaulting to the API URL.
func (p *Platform) Resolve() {
	p.EnvironmentIDs = SplitList(p.EnvironmentIDs...)
	if p.AuthURL == "" {
		p.AuthURL = p.APIURL
	}
}

// Credentials reads the API client's ID and secret. Either missing is an
// error saying where they come from. A Platform not made by
// AddPlatformFlags reads them from the environment.
func (p *Platform) Credentials() (id, secret string, err error) {
	idSrc, secretSrc := p.clientID, p.clientSecret
	if idSrc == nil {
		idSrc = EnvSecret(EnvClientID)
	}
	if secretSrc == nil {
		secretSrc = EnvSecret(EnvClientSecret)
	}
	if id, err = idSrc.Read(); err != nil {
		return "", "", err
	}
	if secret, err = secretSrc.Read(); err != nil {
		return "", "", err
	}
	if id == "" || secret == "" {
		return "", "", fmt.Errorf("API credentials missing: set $%s and $%s (each may also be a file named by $%s_FILE, $%s_FILE; the secret by --client-secret-file)",
			EnvClientID, EnvClientSecret, EnvClientID, EnvClientSecret)
	}
	return id, secret, nil
}
