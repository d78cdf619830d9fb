module github.com/sluicehq/sluice

go 1.25

require (
	go.uber.org/goleak v1.3.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
