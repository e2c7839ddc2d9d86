// The pod sandbox process of the e2e real node (see main.go); no dependencies.
module skiff.dev/e2e/controlplane/pause

go 1.26.0
