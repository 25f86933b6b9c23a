package gateway

// Config is what the data path serves: one Port per address and listening
// port, and the Gateways' own addresses with the node that holds each. It
// is published as JSON in the Secret ConfigSecret, since it holds TLS
// keys.
type Config struct {
	Ports []Port `json:"ports"`
	// Certs are the HTTPS listeners' certificates by the name hosts
	// refer to them by (the Secret's namespace/name): each once, however
	// many hosts and ports use it.
	Certs map[string]Cert `json:"certs,omitempty"`
	// Addresses are the addresses Gateways were given from the server's
	// --gateway-address-range, each held by one node.
	Addresses []HeldAddress `json:"addresses,omitempty"`
}

// HeldAddress is a Gateway's own address and the node that holds it: the
// one that has it on its interface on the address's network and announces
// it there.
type HeldAddress struct {
	Address string `json:"address"`
	Node    string `json:"node"`
}

// Port is one port, HTTP or HTTPS, of one address or of the nodes' own
// addresses, with the listeners of every Gateway on it. A port number has
// one protocol on every address.
type Port struct {
	// Address is the Gateway address (of Config.Addresses) the listeners
	// are on; empty: the nodes' own addresses, that is every address of a
	// node but those of Config.Addresses.
	Address string `json:"address,omitempty"`
	Port    int32  `json:"port"`
	// Protocol is HTTP or HTTPS.
	Protocol string `json:"protocol"`
	// Hosts are the listeners on the port by hostname: a request goes to
	// the one whose hostname matches its host most precisely (an exact
	// name, then the longest wildcard, then the empty hostname, which
	// matches any).
	Hosts []Host `json:"hosts"`
}

// Host is the listeners of one hostname on a port.
type Host struct {
	// Hostname is the listeners' hostname; empty matches any host.
	Hostname string `json:"hostname,omitempty"`
	// CertID names the HTTPS listener's certificate in Config.Certs;
	// empty on HTTP.
	CertID string `json:"certID,omitempty"`
	// Routes are the matches of the routes attached to the listeners,
	// highest precedence first (apart from hostnames, which the data path
	// weighs per request).
	Routes []Route `json:"routes"`
}

// Cert is a TLS certificate chain and its key, PEM.
type Cert struct {
	Cert []byte `json:"cert"`
	Key  []byte `json:"key"`
}

// Route is one match of one rule of an HTTPRoute, with what the rule does.
type Route struct {
	// Name is namespace/name of the HTTPRoute, for logs.
	Name string `json:"name"`
	// Hostnames are the hostnames the match applies to (the route's,
	// narrowed to the listener's); empty: any.
	Hostnames []string      `json:"hostnames,omitempty"`
	Path      PathMatch     `json:"path"`
	Method    string        `json:"method,omitempty"`
	Headers   []ValueMatch  `json:"headers,omitempty"`
	Query     []ValueMatch  `json:"query,omitempty"`
	Request   *HeaderFilter `json:"request,omitempty"`
	Response  *HeaderFilter `json:"response,omitempty"`
	Redirect  *Redirect     `json:"redirect,omitempty"`
	Rewrite   *Rewrite      `json:"rewrite,omitempty"`
	Backends  []Backend     `json:"backends,omitempty"`
}

// Path match types.
const (
	PathExact  = "Exact"
	PathPrefix = "PathPrefix"
	PathRegex  = "RegularExpression"
)

// PathMatch matches the request path.
type PathMatch struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// ValueMatch matches a header (by name, any case) or query parameter.
type ValueMatch struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// Regex: Value is a regular expression (RE2), not the exact value.
	Regex bool `json:"regex,omitempty"`
}

// HeaderFilter changes headers.
type HeaderFilter struct {
	Set    []Header `json:"set,omitempty"`
	Add    []Header `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// Header is a header's name and value.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Redirect answers with a redirect instead of proxying.
type Redirect struct {
	Scheme   string        `json:"scheme,omitempty"`
	Hostname string        `json:"hostname,omitempty"`
	Port     int32         `json:"port,omitempty"`
	Path     *PathModifier `json:"path,omitempty"`
	Status   int           `json:"status"`
}

// Rewrite changes the request before it is proxied.
type Rewrite struct {
	Hostname string        `json:"hostname,omitempty"`
	Path     *PathModifier `json:"path,omitempty"`
}

// PathModifier replaces the whole path or the prefix the route matched.
type PathModifier struct {
	// Full replaces the whole path when set.
	Full *string `json:"full,omitempty"`
	// Prefix replaces the matched prefix when set.
	Prefix *string `json:"prefix,omitempty"`
}

// Backend is a Service port the route proxies to, with its weight.
type Backend struct {
	Weight int32 `json:"weight"`
	// Invalid backends (missing, not permitted, not a Service) answer
	// 500 for their share of requests.
	Invalid   bool   `json:"invalid,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Service   string `json:"service,omitempty"`
	// PortName is the Service port's name, which its EndpointSlices'
	// ports carry; Port is its number, for logs.
	PortName string `json:"portName,omitempty"`
	Port     int32  `json:"port,omitempty"`
	// Request and Response are the backend's own header filters.
	Request  *HeaderFilter `json:"request,omitempty"`
	Response *HeaderFilter `json:"response,omitempty"`
}
