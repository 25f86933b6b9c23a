package apiserver

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
)

func TestForeignWrite(t *testing.T) {
	admin := &user.DefaultInfo{Name: "system:admin", Groups: []string{"system:masters"}}
	node := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup}}
	addon := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:coredns", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system"}}
	app := &user.DefaultInfo{Name: "system:serviceaccount:shop:operator", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:shop"}}
	info := func(verb, group, resource, sub string) *request.RequestInfo {
		return &request.RequestInfo{IsResourceRequest: true, Verb: verb, APIGroup: group, Resource: resource, Subresource: sub, Namespace: "default", Name: "x"}
	}
	for _, tc := range []struct {
		name     string
		user     user.Info
		info     *request.RequestInfo
		query    string
		fromKelp bool
		want     string // "" for none
	}{
		{name: "the admin creates a ConfigMap", user: admin, info: info("create", "", "configmaps", ""), want: "create configmaps x in default"},
		{name: "a workload patches a Deployment", user: app, info: info("patch", "apps", "deployments", ""), want: "patch deployments.apps x in default"},
		{name: "a workload updates a status", user: app, info: info("update", "example.com", "widgets", "status"), want: "update widgets/status.example.com x in default"},
		{name: "kelp's own controllers, as the admin", user: admin, info: info("create", "", "configmaps", ""), fromKelp: true},
		{name: "a read", user: admin, info: info("get", "", "configmaps", "")},
		{name: "a dry run", user: admin, info: info("create", "", "configmaps", ""), query: "dryRun=All"},
		{name: "a kubelet", user: node, info: info("patch", "", "nodes", "status")},
		{name: "an addon", user: addon, info: info("update", "", "endpoints", "")},
		{name: "a lease", user: app, info: info("update", "coordination.k8s.io", "leases", "")},
		{name: "an event", user: app, info: info("create", "events.k8s.io", "events", "")},
		{name: "a review", user: admin, info: info("create", "authorization.k8s.io", "selfsubjectaccessreviews", "")},
		{name: "a token", user: node, info: info("create", "", "serviceaccounts", "token")},
		{name: "the apiserver itself", user: &user.DefaultInfo{Name: user.APIServerUser}, info: info("create", "", "namespaces", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/api?"+tc.query, nil)
			ctx := request.WithUser(request.WithRequestInfo(req.Context(), tc.info), tc.user)
			_, what, ok := foreignWrite(req.WithContext(ctx), func(*http.Request) bool { return tc.fromKelp })
			if what != tc.want || ok != (tc.want != "") {
				t.Errorf("foreignWrite = %q, %v; want %q", what, ok, tc.want)
			}
		})
	}
}

// A request over loopback from this process is kelp's own; from
// another process it is not.
func TestOwnSockets(t *testing.T) {
	var got []bool
	own := &ownSockets{known: map[uint64]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { got = append(got, own.from(req)) }))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 1 || !got[0] {
		t.Skipf("a request from this process is not seen as its own (%v): the kernel may lack sock_diag (inet_diag, tcp_diag)", got)
	}
}
