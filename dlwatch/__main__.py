from dlwatch.cli.main import main

raise SystemExit(main())
