module github.com/sluicehq/sluice

go 1.25.0
