package preflight

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// Names of the PublicURL checks.
const (
	CheckPublicURL            = "public URL"
	CheckPublicURLCertificate = "public URL certificate"
)

// maxDestinationLength is the longest destination_endpoint the platform
// takes (platform notes: RTLD http_post delivery).
const maxDestinationLength = 1024

// soonDays is how close to its expiry a certificate is said to need
// renewing (as the chart's EdgepipeTLSCertificateExpiringSoon alert).
const soonDays = 21

// PublicURL is the receiver's --public-url: where the platform posts the
// log batches, over https only.
type PublicURL struct {
	// URL is --public-url; Destination(env) its destination_endpoint for
	// env, for the length the platform allows.
	URL         string
	Destination func(environmentID string) string
	// WebConfigFile is --web.config.file: the certificate the receiver
	// serves itself, when it names one.
	WebConfigFile string
	// Roots verifies certificates (nil: this machine's, as any HTTPS
	// client of the platform; SSL_CERT_FILE and SSL_CERT_DIR apply).
	Roots *x509.CertPool
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	host, port string
}

// Checks are "public URL" (an https URL the platform takes) and "public URL
// certificate": the certificate served at the URL when it can be reached
// from here, and the one of --web.config.file when given, must cover the
// URL's host, chain to a trusted CA and be valid; the line says which was
// checked.
func (p *PublicURL) Checks() []Check {
	return []Check{
		{Name: CheckPublicURL, Run: p.checkURL},
		{Name: CheckPublicURLCertificate, Needs: []string{CheckPublicURL}, Run: p.checkCertificate},
	}
}

func (p *PublicURL) checkURL(context.Context) Result {
	u, err := url.Parse(strings.TrimSpace(p.URL))
	switch {
	case p.URL == "":
		return Fail("--public-url (or EDGEPIPE_PUBLIC_URL) is not set: set it to the https URL the platform reaches this receiver at")
	case err != nil:
		return Fail("--public-url %q: %v", p.URL, err)
	case u.Scheme != "https":
		return Fail("--public-url %q is not an https URL: the platform posts only to https; serve TLS (--web.config.file) or put a TLS proxy or ingress in front, and give its https URL", p.URL)
	case u.Hostname() == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return Fail("--public-url %q: want https://HOST[:PORT][/PATH], without user, query or fragment", p.URL)
	}
	p.host, p.port = u.Hostname(), u.Port()
	if p.port == "" {
		p.port = "443"
	}
	example := p.Destination("00000000-0000-0000-0000-000000000000")
	if len(example) > maxDestinationLength {
		return Fail("--public-url is too long: destination_endpoint %s… would be %d characters, the platform takes %d", example[:40], len(example), maxDestinationLength)
	}
	return Pass("destination_endpoint %s", p.Destination("<environment_id>"))
}

func (p *PublicURL) checkCertificate(ctx context.Context) Result {
	addr := net.JoinHostPort(p.host, p.port)
	served, reachErr, tlsErr := servedChain(ctx, addr, p.host)
	if tlsErr != nil {
		return Fail("%s answers, but not with TLS the platform can use: %v; serve TLS there (--web.config.file, or the proxy or ingress in front)", addr, tlsErr)
	}
	own, ownErr := webConfigChain(p.WebConfigFile)
	if ownErr != nil {
		return Fail("--web.config.file %s: %v", p.WebConfigFile, ownErr)
	}
	if served != nil {
		if err := p.verify(served); err != nil {
			return Fail("the certificate served at %s: %v", addr, err)
		}
		return Pass("the certificate served at %s%s: %s", addr, p.servedBy(served, own), describe(served[0], p.now()))
	}
	if own == nil {
		return Fail("cannot reach %s (%v), and no certificate is configured here (--web.config.file): the platform cannot deliver either; check DNS, the load balancer or ingress, and that it serves TLS", addr, reachErr)
	}
	if err := p.verify(own); err != nil {
		return Fail("the certificate of --web.config.file: %v", err)
	}
	return Pass("the certificate of --web.config.file (%s is not reachable from here: %v): %s", addr, reachErr, describe(own[0], p.now()))
}

// servedBy says whose the served certificate is, when the receiver has
// its own.
func (p *PublicURL) servedBy(served, own []*x509.Certificate) string {
	switch {
	case own == nil:
		return ""
	case served[0].Equal(own[0]):
		return " (the receiver's own, --web.config.file)"
	}
	return " (not the receiver's own: a proxy or ingress in front serves it)"
}

func (p *PublicURL) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// verify checks that chain's leaf covers the host, is valid now and chains
// to a trusted root.
func (p *PublicURL) verify(chain []*x509.Certificate) error {
	leaf, now := chain[0], p.now()
	if err := leaf.VerifyHostname(p.host); err != nil {
		return fmt.Errorf("it does not cover %s (it is for %s): use a certificate for %s, or give the --public-url its certificate is for", p.host, names(leaf), p.host)
	}
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return fmt.Errorf("it is valid from %s to %s, not now: renew it", leaf.NotBefore.UTC().Format(time.DateOnly), leaf.NotAfter.UTC().Format(time.DateOnly))
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.Roots, Intermediates: inter, CurrentTime: now}); err != nil {
		return fmt.Errorf("%w (issuer %q): the platform verifies it as any HTTPS client does; use a certificate of a public CA (for example Let's Encrypt through cert-manager), with its intermediates", err, leaf.Issuer.String())
	}
	return nil
}

// servedChain dials addr and returns the certificates it serves for
// serverName: reachErr when it cannot be reached or drops the connection
// (a load balancer without a ready receiver behind it), tlsErr when it
// answers something else than TLS.
func servedChain(ctx context.Context, addr, serverName string) (chain []*x509.Certificate, reachErr, tlsErr error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err, nil
	}
	defer conn.Close()
	// Verified by verify, which says what is wrong.
	tc := tls.Client(conn, &tls.Config{ServerName: serverName, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // verified below
	if err := tc.HandshakeContext(ctx); err != nil {
		var notTLS tls.RecordHeaderError
		var alert tls.AlertError
		if errors.As(err, &notTLS) || errors.As(err, &alert) {
			return nil, nil, err
		}
		return nil, err, nil
	}
	chain = tc.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, nil, errors.New("no certificate")
	}
	return chain, nil, nil
}

// describe says whom a valid certificate is for, who issued it and how
// long it is valid.
func describe(leaf *x509.Certificate, now time.Time) string {
	days := int(leaf.NotAfter.Sub(now).Hours() / 24)
	s := fmt.Sprintf("for %s, issued by %q, valid until %s (%d days)", names(leaf), leaf.Issuer.String(), leaf.NotAfter.UTC().Format(time.DateOnly), days)
	if days < soonDays {
		s += ": renew it soon"
	}
	return s
}

// names lists the names a certificate is for.
func names(c *x509.Certificate) string {
	n := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		n = append(n, ip.String())
	}
	if len(n) == 0 {
		return c.Subject.CommonName
	}
	return strings.Join(n, ", ")
}
