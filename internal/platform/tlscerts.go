package platform

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// The config service (spec 4.2): deployments, environment variables and TLS
// certificates. edgepipe reads its TLS certificates.
const (
	ServiceConfig = "config"
	VersionConfig = "v0.1"
	ScopeConfig   = "app.config"
)

// TLSCertificate is a TLS certificate of an environment (spec 2.6). The
// private key is not a response field.
type TLSCertificate struct {
	ID               string    `json:"id"`
	EnvironmentID    string    `json:"environment_id"`
	PrimaryCert      string    `json:"primary_cert,omitempty"`
	IntermediateCert string    `json:"intermediate_cert,omitempty"`
	Status           string    `json:"status"`
	Serial           string    `json:"serial"`
	CommonName       string    `json:"common_name"`
	ActivationError  string    `json:"activation_error,omitempty"`
	Expiration       time.Time `json:"expiration"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
	Generated        bool      `json:"generated"`
	AlternativeNames []string  `json:"alternative_names,omitempty"`
}

// ConfigService is the config service (/config/v0.1, scope app.config).
// Its embedded Service serves calls not wrapped here.
type ConfigService struct {
	*Service
}

// ConfigService returns the config service.
func (c *Client) ConfigService() *ConfigService {
	return &ConfigService{Service: c.Service(ServiceConfig, VersionConfig, ScopeConfig)}
}

// TLSCertificates lists every TLS certificate of an environment, walking all
// pages (GET /tls-certs?environment_id=…, PageSize per page).
func (c *ConfigService) TLSCertificates(ctx context.Context, environmentID string) ([]TLSCertificate, error) {
	cs, err := listAll[TLSCertificate](ctx, c.Service, "/tls-certs", url.Values{"environment_id": {environmentID}},
		func(t TLSCertificate) string { return t.ID })
	if err != nil {
		return nil, fmt.Errorf("TLS certificates of environment %s: %w", environmentID, err)
	}
	return cs, nil
}

// TLSCertificate gets one TLS certificate.
func (c *ConfigService) TLSCertificate(ctx context.Context, id string) (*TLSCertificate, error) {
	var t TLSCertificate
	if err := c.Do(ctx, http.MethodGet, "/tls-certs/"+url.PathEscape(id), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
